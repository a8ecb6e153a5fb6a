"""The Triton rejection sampler against the torch path on the same uniforms (skips without CUDA)."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from interlock.kernels.rejection import rejection_sample, rejection_sample_greedy  # noqa: E402


def _inputs(gen: torch.Generator, b: int, k: int, v: int, sharp: float) -> tuple[torch.Tensor, ...]:
    p = torch.softmax(torch.randn(b, k + 1, v, generator=gen) * sharp, -1)
    d = torch.randint(0, v, (b, k), generator=gen)
    likely = p[:, :k].argmax(-1)
    d = torch.where(torch.rand(b, k, generator=gen) < 0.7, likely, d)   # most drafts plausible
    d[0, 0] = -1                                                          # outside the vocabulary
    n = torch.randint(0, k + 1, (b,), generator=gen)
    u = torch.rand(b, k + 1, generator=gen)
    return p, d, n, u


def _ambiguous(weights: torch.Tensor, u: float, token: int) -> bool:
    """True when the draw's target lies within float32 rounding of a CDF step near `token`."""
    cdf = weights.double().cumsum(0)
    target = u * float(cdf[-1])
    slack = 1e-5 * float(cdf[-1])
    lo = max(token - 1, 0)
    return abs(float(cdf[lo]) - target) < slack or abs(float(cdf[token]) - target) < slack


@pytest.mark.parametrize("with_q", [False, True])
@pytest.mark.parametrize("vocab", [50, 1000 + 3, 128256])
def test_stochastic_equals_torch_on_the_same_uniforms(with_q: bool, vocab: int, gen: torch.Generator) -> None:
    b, k = 64, 5
    p, d, n, u = _inputs(gen, b, k, vocab, sharp=4.0)
    q = torch.softmax(torch.randn(b, k, vocab, generator=gen) * 4.0, -1) if with_q else None
    ref = rejection_sample(p, d, q, n, u, backend="torch")
    out = rejection_sample(p.cuda(), d.cuda(), None if q is None else q.cuda(), n.cuda(), u.cuda(), backend="cuda")
    assert torch.equal(out.num_accepted.cpu(), ref.num_accepted)   # the accept tests are exact
    tokens = out.tokens.cpu()
    differ = (tokens != ref.tokens).any(1).nonzero().flatten().tolist()
    for row in differ:   # only the resampled token may differ, and only at a CDF step
        j = int(ref.num_accepted[row])
        assert torch.equal(tokens[row, :j], ref.tokens[row, :j])
        w = p[row, j].clone()
        if j < int(n[row]) and q is not None:
            w = (w - q[row, j]).clamp(min=0)
        elif j < int(n[row]) and 0 <= int(d[row, j]) < vocab:
            w[int(d[row, j])] = 0.0
        assert _ambiguous(w, float(u[row, k]), int(ref.tokens[row, j])), f"row {row} differs off a CDF step"
    assert len(differ) <= 1


def test_dyadic_probabilities_agree_exactly(gen: torch.Generator) -> None:
    """Weights that are multiples of 2**-16 sum exactly in any order: results must be identical."""
    b, k, v = 32, 3, 4096
    raw = torch.randint(0, 64, (b, k + 1, v), generator=gen).float()
    p = raw / 2**16
    d = p[:, :k].argmax(-1)
    d[::3, 1] = torch.randint(0, v, (len(d[::3]),), generator=gen)
    n = torch.full((b,), k)
    u = torch.rand(b, k + 1, generator=gen)
    ref = rejection_sample(p, d, None, n, u, backend="torch")
    out = rejection_sample(p.cuda(), d.cuda(), None, n.cuda(), u.cuda(), backend="cuda")
    assert torch.equal(out.tokens.cpu(), ref.tokens) and torch.equal(out.num_accepted.cpu(), ref.num_accepted)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_equals_torch(dtype: torch.dtype, gen: torch.Generator) -> None:
    b, k, v = 64, 5, 128256
    logits = torch.randn(b, k + 1, v, generator=gen).to(dtype)
    logits[3, :, 7] = logits[3, :, 5] = 100.0                   # a tie: the lowest id wins
    d = logits[:, :k].float().argmax(-1)
    d[::2, 2] = 11                                               # some mismatches
    n = torch.randint(0, k + 1, (b,), generator=gen)
    ref = rejection_sample_greedy(logits, d, n, backend="torch")
    out = rejection_sample_greedy(logits.cuda(), d.cuda(), n.cuda(), backend="cuda")
    assert torch.equal(out.tokens.cpu(), ref.tokens) and torch.equal(out.num_accepted.cpu(), ref.num_accepted)
    assert int(out.tokens[3, 0]) == 5
