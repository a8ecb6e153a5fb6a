"""The Triton mask kernel against the torch reference on random inputs (skips without CUDA)."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from interlock.kernels.bitmask import apply_token_bitmask_  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _both(logits: torch.Tensor, bitmask: torch.Tensor, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
    cuda = logits.cuda()
    apply_token_bitmask_(cuda, bitmask.cuda(), backend="cuda",
                         **{k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
    ref = logits.clone()
    apply_token_bitmask_(ref, bitmask, backend="torch", **kwargs)
    return cuda.cpu(), ref


@pytest.mark.parametrize("vocab", [1, 31, 33, 1000, 49152 + 7, 128256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_reference(vocab: int, dtype: torch.dtype, gen: torch.Generator, random_bitmask) -> None:
    logits = torch.randn(5, vocab, generator=gen).to(dtype)
    bitmask = random_bitmask(5, vocab, gen)
    out, ref = _both(logits, bitmask)
    assert torch.equal(out, ref)
    kept = out > float("-inf")
    assert torch.equal(out[kept], logits[kept])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_skip_d2t_and_limit(dtype: torch.dtype, gen: torch.Generator, random_bitmask) -> None:
    target_vocab, draft_vocab = 1000, 777
    bitmask = random_bitmask(4, target_vocab, gen)
    logits = torch.randn(6, draft_vocab, generator=gen).to(dtype)
    rows = torch.tensor([3, 0, 0, 2, 1, 3], dtype=torch.int32)
    skip = torch.tensor([False, True, False, False, True, False])
    d2t = torch.randint(-5, target_vocab + 40, (draft_vocab,), generator=gen)
    out, ref = _both(logits, bitmask, rows=rows, skip=skip, d2t=d2t, mask_vocab_size=990)
    assert torch.equal(out, ref)
    assert torch.equal(out[skip], logits[skip])


def test_auto_picks_cuda_and_bad_inputs_raise() -> None:
    logits = torch.zeros(2, 70, device="cuda")
    apply_token_bitmask_(logits, torch.tensor([[-(2**31), -1, 1]] * 2, dtype=torch.int32, device="cuda"))
    assert (logits[0] == 0).nonzero().flatten().tolist() == [31, *range(32, 64), 64]
    with pytest.raises(ValueError):
        apply_token_bitmask_(torch.zeros(2, 70), torch.zeros(2, 3, dtype=torch.int32), backend="cuda")
    with pytest.raises(ValueError):
        apply_token_bitmask_(logits.half().to(torch.int32), torch.zeros(2, 3, dtype=torch.int32, device="cuda"),
                             backend="cuda")
