"""kernels/penalties.py against its slow obvious reference, and the properties that make it safe."""
from __future__ import annotations

import pytest
import torch

from interlock.kernels.penalties import apply_penalties, draft_counts

INF = float("inf")


def _case(rows: int, vocab: int, seed: int, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=g) * 4).to(dtype)
    logits[torch.rand(rows, vocab, generator=g) < 0.2] = -INF                    # grammar-banned ids
    logits[:, 0] = 0.0                                                          # x == 0 stays 0 under r
    counts = torch.randint(0, 4, (rows, vocab), generator=g) * (torch.rand(rows, vocab, generator=g) < 0.3)
    prompt = torch.rand(rows, vocab, generator=g) < 0.25
    presence = torch.empty(rows).uniform_(-2, 2, generator=g)
    frequency = torch.empty(rows).uniform_(-2, 2, generator=g)
    repetition = torch.empty(rows).uniform_(0.5, 2.0, generator=g)
    return logits, counts, prompt, presence, frequency, repetition


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_reference(seed: int, dtype: torch.dtype) -> None:
    args = _case(5, 97, seed, dtype)
    fast, ref = apply_penalties(*args), apply_penalties(*args, backend="reference")
    assert fast.dtype == dtype
    assert torch.equal(torch.isinf(fast), torch.isinf(ref))
    finite = torch.isfinite(ref)
    torch.testing.assert_close(fast[finite].float(), ref[finite].float(), rtol=1e-6 if dtype == torch.float32 else 1e-2,
                               atol=1e-5 if dtype == torch.float32 else 1e-2)


def test_off_is_the_identity_and_banned_stays_banned() -> None:
    logits, counts, prompt, *_ = _case(4, 50, 7)
    zeros, ones = torch.zeros(4), torch.ones(4)
    assert torch.equal(apply_penalties(logits, counts, prompt, zeros, zeros, ones), logits)
    big = apply_penalties(logits, counts * 1000, torch.ones_like(prompt), torch.full((4,), 2.0), torch.full((4,), 2.0),
                          torch.full((4,), 100.0))
    assert torch.equal(big == -INF, logits == -INF) and not big.isnan().any()


def test_semantics_on_one_row() -> None:
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0, 3.0]])
    counts = torch.tensor([[0, 0, 2, 1, 0, 0]])
    prompt = torch.tensor([[True, True, False, False, False, False]])
    out = apply_penalties(logits, counts, prompt, torch.tensor([0.5]), torch.tensor([0.25]), torch.tensor([2.0]))
    # prompt ids: repetition only; output ids: repetition, then 0.25 per occurrence, then 0.5 once.
    assert out.tolist() == [[1.0, -4.0, 1.0 - 0.5 - 0.5, -4.0 - 0.25 - 0.5, 1.0, 3.0]]


@pytest.mark.parametrize("seed", range(5))
def test_draft_counts_match_the_reference(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    b, k, v = 4, 5, 23
    counts = torch.randint(0, 3, (b, v), generator=g)
    drafts = torch.randint(-2, v + 3, (b, k), generator=g)                     # some out of vocabulary
    drafts[0, :3] = 7                                                          # repeats count twice
    num = torch.tensor([5, 3, 0, 2])
    fast, ref = draft_counts(counts, drafts, num), draft_counts(counts, drafts, num, backend="reference")
    assert torch.equal(fast, ref)
    assert torch.equal(fast[:, 0], counts)
    assert int(fast[0, 3, 7]) == int(counts[0, 7]) + 3


def test_bad_arguments_raise_value_error() -> None:
    logits, counts, prompt, p, f, r = _case(2, 10, 0)
    with pytest.raises(ValueError):
        apply_penalties(logits, counts.float(), prompt, p, f, r)
    with pytest.raises(ValueError):
        apply_penalties(logits, counts, prompt[:1], p, f, r)
    with pytest.raises(ValueError):
        apply_penalties(logits, counts, prompt, p, f, r, backend="nope")
    with pytest.raises(ValueError):
        draft_counts(counts, torch.zeros(3, 2, dtype=torch.long), torch.zeros(2, dtype=torch.long))
