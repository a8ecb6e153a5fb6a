"""llguidance's mask and consume calls on torch bitmasks, without importing llguidance.torch: that
module puts a torch.compile decorator on a function we never call, which imports torch._dynamo and
torch._inductor (~3 s of every start on a 2-core machine). These are the same checks and the same
native calls as llguidance.torch's functions of the same names (llguidance 1.9).
"""
from __future__ import annotations

from typing import Any

import torch


def fill_next_token_bitmask(matcher: Any, bitmask: torch.Tensor, index: int = 0) -> None:
    """Row `index` of `bitmask` [rows, ceil(V/32)] int32 := the tokens `matcher` allows next."""
    _check(bitmask)
    row = bitmask[index, :]
    assert row.is_contiguous(), "Mask must be contiguous"
    matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())


def fill_next_token_bitmask_par(executor: Any, matchers: list[tuple[Any, int]], bitmask: torch.Tensor) -> None:
    """Each (matcher, row): that row := the tokens the matcher allows next, in parallel."""
    _check(bitmask)
    assert bitmask.is_contiguous(), "Mask must be contiguous"
    batch, words = bitmask.shape
    executor.unsafe_compute_mask_ptr(matchers, bitmask.data_ptr(), words * 4, batch)


def fill_next_token_bitmask_par_with_draft_tokens(executor: Any, matchers: list[tuple[Any, int, list[int]]],
                                                  bitmask: torch.Tensor) -> None:
    """Each (matcher, row, drafts): rows row .. row + len(drafts) := the masks after drafts[:j]."""
    _check(bitmask)
    assert bitmask.is_contiguous(), "Mask must be contiguous"
    batch, words = bitmask.shape
    executor.unsafe_compute_mask_ptr_with_draft_token(matchers, bitmask.data_ptr(), words * 4, batch)


def consume_token_par(executor: Any, matchers: list[tuple[Any, int]]) -> list[bool]:
    """Each (matcher, token): the matcher consumes the token, in parallel; whether each took it."""
    return executor.consume_token_par(matchers)


def _check(bitmask: torch.Tensor) -> None:
    assert bitmask.dtype == torch.int32, "Mask must be int32"
    assert bitmask.is_cpu, "Mask must be on CPU"
    assert bitmask.dim() == 2, "Mask must be 2D"
