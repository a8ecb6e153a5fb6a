"""apply_token_bitmask_: fast path against the looping reference, and the bit convention by hand."""
from __future__ import annotations

import pytest
import torch

from interlock.kernels.bitmask import apply_token_bitmask_

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _both(logits: torch.Tensor, bitmask: torch.Tensor, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch and the capturable (tensor ops, no host read) backends, each against the reference."""
    fast, capturable, ref = logits.clone(), logits.clone(), logits.clone()
    apply_token_bitmask_(fast, bitmask, backend="torch", **kwargs)
    apply_token_bitmask_(capturable, bitmask, backend="capturable", **kwargs)
    apply_token_bitmask_(ref, bitmask, backend="reference", **kwargs)
    assert torch.equal(capturable, ref)
    return fast, ref


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 1000, 49152 + 7])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_matches_reference(vocab: int, dtype: torch.dtype, gen: torch.Generator, random_bitmask) -> None:
    logits = torch.randn(3, vocab, generator=gen).to(dtype)
    bitmask = random_bitmask(3, vocab, gen)
    fast, ref = _both(logits, bitmask)
    assert torch.equal(fast, ref)
    kept = fast > float("-inf")
    assert torch.equal(fast[kept], logits[kept])  # allowed logits are untouched
    assert 0 < int(kept.sum()) < 3 * vocab or vocab < 32


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_skip_d2t_and_vocab_limit(dtype: torch.dtype, gen: torch.Generator, random_bitmask) -> None:
    target_vocab, draft_vocab, n_rows = 1000, 777, 6
    bitmask = random_bitmask(4, target_vocab, gen)
    logits = torch.randn(n_rows, draft_vocab, generator=gen).to(dtype)
    rows = torch.tensor([3, 0, 0, 2, 1, 3], dtype=torch.int32)
    skip = torch.tensor([False, True, False, False, True, False])
    d2t = torch.randint(-5, target_vocab + 40, (draft_vocab,), generator=gen)  # some ids map nowhere
    fast, ref = _both(logits, bitmask, rows=rows, skip=skip, d2t=d2t, mask_vocab_size=990)
    assert torch.equal(fast, ref)
    assert torch.equal(fast[skip], logits[skip])
    outside = (d2t < 0) | (d2t >= 990)
    assert bool((fast[~skip][:, outside] == float("-inf")).all())


@pytest.mark.parametrize("vocab", [1000, 1088])
def test_rows_skip_and_vocab_limit_on_the_target_vocabulary(vocab: int, gen: torch.Generator, random_bitmask) -> None:
    # fp32 CPU rows without d2t: the path a verify step takes (xgrammar's C++ kernel).
    bitmask = random_bitmask(5, 1024, gen)
    logits = torch.randn(6, vocab, generator=gen)
    rows = torch.tensor([4, 0, 0, 2, 1, 4])
    skip = torch.tensor([False, True, False, False, True, False])
    fast, ref = _both(logits, bitmask, rows=rows, skip=skip, mask_vocab_size=990)
    assert torch.equal(fast, ref)
    assert torch.equal(fast[skip], logits[skip])
    assert bool((fast[~skip][:, 990:] == float("-inf")).all())
    everything = torch.ones(6, dtype=torch.bool)
    fast, ref = _both(logits, bitmask, rows=rows, skip=everything)
    assert torch.equal(fast, logits) and torch.equal(ref, logits)


def test_bit_convention_by_hand() -> None:
    # Word 0: only bit 31 (the sign bit) set; word 1: every bit set (-1); word 2: bit 0 only.
    bitmask = torch.tensor([[-(2**31), -1, 1]], dtype=torch.int32)
    logits = torch.zeros(1, 70)
    apply_token_bitmask_(logits, bitmask)
    allowed = (logits[0] == 0).nonzero().flatten().tolist()
    assert allowed == [31, *range(32, 64), 64]


def test_ids_beyond_the_mask_are_disallowed() -> None:
    # The tiny model: 1088 logits, a 1024-token tokenizer, a mask that allows everything.
    logits = torch.zeros(2, 1088)
    bitmask = torch.full((2, 32), -1, dtype=torch.int32)
    apply_token_bitmask_(logits, bitmask)
    assert bool((logits[:, :1024] == 0).all()) and bool((logits[:, 1024:] == float("-inf")).all())
    logits = torch.zeros(1, 1088)
    apply_token_bitmask_(logits, bitmask[:1], mask_vocab_size=1000)
    assert bool((logits[0, 1000:] == float("-inf")).all()) and bool((logits[0, :1000] == 0).all())


def test_matches_xgrammar(gen: torch.Generator, random_bitmask) -> None:
    xgr = pytest.importorskip("xgrammar")
    logits = torch.randn(4, 1000, generator=gen)
    bitmask = random_bitmask(4, 1000, gen)
    ours, theirs = logits.clone(), logits.clone()
    apply_token_bitmask_(ours, bitmask)
    xgr.apply_token_bitmask_inplace(theirs, bitmask)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"backend": "triton"},
        {"backend": "cuda"},  # CPU tensors: the CUDA backend refuses them
    ],
)
def test_bad_backend_raises(kwargs: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        apply_token_bitmask_(torch.zeros(1, 32), torch.zeros(1, 1, dtype=torch.int32), **kwargs)


def test_bad_dtypes_and_shapes_raise() -> None:
    ok_mask = torch.zeros(2, 1, dtype=torch.int32)
    bad_calls = [
        lambda: apply_token_bitmask_(torch.zeros(2, 32, dtype=torch.float64), ok_mask),
        lambda: apply_token_bitmask_(torch.zeros(2, 32), ok_mask.long()),
        lambda: apply_token_bitmask_(torch.zeros(2, 32), ok_mask, skip=torch.zeros(2)),
        lambda: apply_token_bitmask_(torch.zeros(2, 32), ok_mask, rows=torch.zeros(2)),
        lambda: apply_token_bitmask_(torch.zeros(2, 32), ok_mask, d2t=torch.zeros(32, dtype=torch.int32)),
        lambda: apply_token_bitmask_(torch.zeros(2, 32), ok_mask, d2t=torch.zeros(31, dtype=torch.int64)),
        lambda: apply_token_bitmask_(torch.zeros(3, 32), ok_mask),  # fewer bitmask rows, no map
        lambda: apply_token_bitmask_(torch.zeros(2, 32), ok_mask.to("meta")),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()
