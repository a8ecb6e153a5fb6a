"""Sampling kernels: fast against reference, zero-weight ids never drawn, per-request determinism."""
from __future__ import annotations

import pytest
import torch

from interlock.kernels.sampling import draw_uniforms, probs_from_logits, sample, sample_from_probs


def _params(n_rows: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3] * n_rows)[:n_rows]
    top_k = torch.randint(-1, 12, (n_rows,), generator=gen)
    top_p = torch.where(torch.rand(n_rows, generator=gen) < 0.5, 1.0, torch.rand(n_rows, generator=gen) * 0.9 + 0.05)
    return temperature, top_k, top_p


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_probs_fast_matches_reference(dtype: torch.dtype, gen: torch.Generator) -> None:
    n_rows, vocab = 40, 50
    logits = (torch.randn(n_rows, vocab, generator=gen) * 3).to(dtype)
    logits[torch.rand(n_rows, vocab, generator=gen) < 0.3] = float("-inf")
    logits[:, 0] = 1.0  # every row keeps at least one allowed token
    temperature, top_k, top_p = _params(n_rows, gen)
    fast = probs_from_logits(logits, temperature, top_k, top_p, backend="torch")
    ref = probs_from_logits(logits, temperature, top_k, top_p, backend="reference")
    assert fast.dtype == torch.float32
    assert torch.equal(fast > 0, ref > 0)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(fast.sum(-1), torch.ones(n_rows))
    assert bool((fast[logits == float("-inf")] == 0).all())


def test_top_k_top_p_and_greedy_by_hand() -> None:
    logits = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3]] * 4))
    temperature = torch.tensor([1.0, 1.0, 1.0, 0.0])
    top_k = torch.tensor([2, 0, 2, 0])
    top_p = torch.tensor([1.0, 0.65, 0.5, 1.0])
    probs = probs_from_logits(logits, temperature, top_k, top_p)
    expected = torch.tensor([[0, 4 / 7, 0, 3 / 7], [0, 4 / 7, 0, 3 / 7], [0, 1, 0, 0], [0, 1, 0, 0]])
    torch.testing.assert_close(probs, expected)


def test_sample_fast_matches_reference_and_skips_zero_weight(gen: torch.Generator) -> None:
    n_rows, vocab = 300, 37
    weights = torch.rand(n_rows, vocab, generator=gen)
    weights[torch.rand(n_rows, vocab, generator=gen) < 0.6] = 0.0
    weights[:, 3] += 0.01  # at least one positive weight per row
    weights[:, -5:] = 0.0  # a zero tail: u close to 1 must not walk into it
    uniforms = torch.rand(n_rows, generator=gen)
    uniforms[:20] = 1.0 - 2.0**-24  # the largest float32 below 1
    uniforms[20:40] = 0.0
    fast = sample_from_probs(weights, uniforms, backend="torch")
    ref = sample_from_probs(weights, uniforms, backend="reference")
    assert torch.equal(fast, ref)
    assert bool((weights.gather(1, fast.unsqueeze(1)) > 0).all())


def test_greedy_rows_take_the_argmax_whatever_the_uniform(gen: torch.Generator) -> None:
    logits = torch.randn(64, 100, generator=gen)
    zeros = torch.zeros(64)
    tokens = sample(logits, zeros, torch.zeros(64, dtype=torch.long), torch.ones(64), torch.rand(64, generator=gen))
    assert torch.equal(tokens, logits.argmax(-1))


def test_same_seed_same_tokens_whatever_the_batch(gen: torch.Generator) -> None:
    vocab, steps = 200, 5
    mine = torch.randn(steps, vocab, generator=gen)
    others = torch.randn(steps, 3, vocab, generator=gen)

    def run(position: int, batch: int) -> list[int]:
        generators = [torch.Generator().manual_seed(s) for s in (11, 22, 33, 44)[:batch]]
        generators[position] = torch.Generator().manual_seed(7)
        out = []
        for step in range(steps):
            rows = list(others[step, : batch - 1])
            rows.insert(position, mine[step])
            logits = torch.stack(rows)
            u = draw_uniforms(generators, 1)[:, 0]
            t = torch.full((batch,), 0.9)
            tokens = sample(logits, t, torch.full((batch,), 50), torch.full((batch,), 0.95), u)
            out.append(int(tokens[position]))
        return out

    alone = run(0, 1)
    assert run(2, 3) == alone
    assert run(1, 4) == alone
    assert len(set(alone)) > 1  # the draws really vary from step to step


def test_draw_uniforms_follows_each_generator() -> None:
    a = draw_uniforms([torch.Generator().manual_seed(5), torch.Generator().manual_seed(6)], 4)
    b = draw_uniforms([torch.Generator().manual_seed(6)], 4)
    assert a.shape == (2, 4) and torch.equal(a[1], b[0]) and not torch.equal(a[0], a[1])
    assert bool(((a >= 0) & (a < 1)).all())


def test_dispatchers_raise_value_error() -> None:
    logits, p1 = torch.zeros(2, 8), torch.ones(2)
    k = torch.zeros(2, dtype=torch.long)
    bad_calls = [
        lambda: probs_from_logits(logits, p1, k, p1, backend="bogus"),
        lambda: probs_from_logits(logits, p1, k, p1, backend="cuda"),
        lambda: probs_from_logits(logits.long(), p1, k, p1),
        lambda: probs_from_logits(logits, p1, k.float(), p1),
        lambda: probs_from_logits(logits, torch.ones(3), k, p1),
        lambda: sample_from_probs(logits, p1.long()),
        lambda: sample_from_probs(logits.double(), p1),
        lambda: sample_from_probs(logits, p1.to("meta")),
        lambda: sample_from_probs(logits, p1, backend="gpu"),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()


def test_filters_off_by_none_equal_filters_off_by_value(gen: torch.Generator) -> None:
    logits = torch.randn(16, 90, generator=gen)
    temperature = torch.tensor([0.0, 0.5, 1.0, 2.0] * 4)
    by_none = probs_from_logits(logits, temperature)
    by_value = probs_from_logits(logits, temperature, torch.zeros(16, dtype=torch.long), torch.ones(16))
    assert torch.equal(by_none, by_value)
    torch.testing.assert_close(by_none, probs_from_logits(logits, temperature, backend="reference"))
    only_k = probs_from_logits(logits, temperature, top_k=torch.full((16,), 4))
    assert bool(((only_k > 0).sum(-1) <= 4).all())
