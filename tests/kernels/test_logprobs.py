"""token_logprobs: fast against the slow reference, by hand, and equal to log of the sampler's law."""
from __future__ import annotations

import math

import pytest
import torch

from interlock.kernels import probs_from_logits, token_logprobs

NEG = float("-inf")


def _case(gen: torch.Generator, rows: int = 40, vocab: int = 50):
    logits = torch.randn(rows, vocab, generator=gen) * 3
    logits[torch.rand(rows, vocab, generator=gen) < 0.3] = NEG
    logits[:, 0] = 1.0                                            # at least one allowed id per row
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3] * rows)[:rows]
    top_k = torch.randint(-1, 12, (rows,), generator=gen)
    top_p = torch.where(torch.rand(rows, generator=gen) < 0.5, 1.0, torch.rand(rows, generator=gen) * 0.9 + 0.05)
    return logits, temperature, top_k, top_p


@pytest.mark.parametrize("n", [0, 1, 5, 20])
def test_fast_matches_reference(gen: torch.Generator, n: int) -> None:
    logits, temperature, top_k, top_p = _case(gen)
    probs = probs_from_logits(logits, torch.where(temperature > 0, temperature, 1.0), top_k, top_p)
    tokens = torch.multinomial(probs, 1, generator=gen).squeeze(1)      # allowed ids: finite logprobs
    fast = token_logprobs(logits, tokens, temperature, top_k, top_p, n=n, backend="torch")
    ref = token_logprobs(logits, tokens, temperature, top_k, top_p, n=n, backend="reference")
    assert fast.top_ids.shape == ref.top_ids.shape == (40, n)
    torch.testing.assert_close(fast.token, ref.token, atol=1e-4, rtol=1e-4)
    assert torch.equal(torch.isinf(fast.top), torch.isinf(ref.top))
    finite = torch.isfinite(ref.top)
    torch.testing.assert_close(fast.top[finite], ref.top[finite], atol=1e-4, rtol=1e-4)
    assert torch.equal(fast.top_ids[finite], ref.top_ids[finite])
    assert bool(torch.isfinite(fast.token).all())


def test_by_hand_greedy_at_temperature_one_and_top_k() -> None:
    logits = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.1, 0.4, 0.2, 0.3], [0.1, 0.4, 0.2, 0.3]]))
    logits[2, 3] = NEG                                             # the grammar refuses id 3
    tokens = torch.tensor([1, 3, 2])
    out = token_logprobs(logits, tokens, torch.tensor([0.0, 1.0, 0.0]), torch.tensor([0, 2, 0]), None, n=4)
    expected_token = torch.tensor([math.log(0.4), math.log(3 / 7), math.log(0.2 / 0.7)])
    torch.testing.assert_close(out.token, expected_token)
    assert out.top_ids[0].tolist() == [1, 3, 2, 0]
    assert out.top_ids[1, :2].tolist() == [1, 3] and bool(torch.isinf(out.top[1, 2:]).all())   # top-k 2
    assert out.top_ids[2, :3].tolist() == [1, 2, 0] and math.isinf(float(out.top[2, 3]))       # masked id last
    torch.testing.assert_close(out.top[0], torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1])))


def test_equals_log_of_the_sampling_law(gen: torch.Generator) -> None:
    """For a sampled row, exp(logprob) is the probability the sampler gives that token."""
    logits, temperature, top_k, top_p = _case(gen)
    temperature = temperature.clamp(min=0.5)
    probs = probs_from_logits(logits, temperature, top_k, top_p)
    tokens = probs.argmax(-1)
    out = token_logprobs(logits, tokens, temperature, top_k, top_p, n=3)
    torch.testing.assert_close(out.token.exp(), probs.gather(1, tokens[:, None]).squeeze(1), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out.top.exp(), probs.sort(-1, descending=True).values[:, :3], atol=1e-5, rtol=1e-4)


def test_bad_arguments() -> None:
    logits = torch.zeros(2, 4)
    with pytest.raises(ValueError):
        token_logprobs(logits, torch.zeros(3, dtype=torch.long), torch.ones(2))
    with pytest.raises(ValueError):
        token_logprobs(logits, torch.zeros(2, dtype=torch.long), torch.ones(2), n=5)
    with pytest.raises(ValueError):
        token_logprobs(logits, torch.zeros(2, dtype=torch.long), torch.ones(2), backend="bogus")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_match_the_cpu_reference(gen: torch.Generator) -> None:
    logits, temperature, top_k, top_p = _case(gen)
    tokens = logits.argmax(-1)
    cpu = token_logprobs(logits, tokens, temperature, top_k, top_p, n=4, backend="reference")
    gpu = token_logprobs(logits.cuda(), tokens.cuda(), temperature.cuda(), top_k.cuda(), top_p.cuda(), n=4)
    assert gpu.token.device.type == "cuda"
    torch.testing.assert_close(gpu.token.cpu(), cpu.token, atol=1e-4, rtol=1e-4)
    finite = torch.isfinite(cpu.top)
    torch.testing.assert_close(gpu.top.cpu()[finite], cpu.top[finite], atol=1e-4, rtol=1e-4)
