"""Statistical exactness with sampled drafts from a draft model, under a grammar, on the device
runner (captured steps, the CPU under CUDA's rules): the first tokens of a constrained request,
drawn over many seeds, follow the masked target law computed directly from the model, although
the 1-layer self-draft of a random model proposes from another law (q), draws under the grammar's
draft-side rows and is often rejected. A chi-square test at ALPHA / len(CASES) per case; a planted
bug must be rejected by the same test: verification that divides by a q a million times too small
(a lost normalization), so that it accepts nearly every sampled draft. Telling verification the
drafts were point masses is no such bug: accepting d with p(d) and resampling from p without d
still gives p, only with fewer acceptances.
The default run draws DRAWS for the sampling case (each draw is a request through the deferred-op
timeline: the slow part of CI); `pytest -m soak` draws SOAK_DRAWS for both cases."""
from __future__ import annotations

import anyio
import pytest
import torch

from interlock.kernels import verify_features
from interlock.engine import Engine, EngineConfig
from interlock.protocol.grammar import Regex
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from chi_square import chi_square_pvalue
from helpers import assert_all_free, wait_idle
from resources import DEVICE_CONTEXT
from laws import draw, target_law

ALPHA = 1e-3
# 160 draws keep the trusting verifier's p below 1e-140; the soak draws SOAK_DRAWS
DRAWS, SOAK_DRAWS = 160, 4000
WORDS = Regex(r"(alpha|beta|gamma|delta)( one| two| three){0,2}")    # few outcomes: the law stays small
PROMPT = "alpha one beta two"
CASES = {"sample": {"temperature": 2.0}, "top_k": {"temperature": 2.0, "top_k": 4}}
SPEC = SpeculativeConfig(("self-draft",), max_draft_len=3, self_draft_layers=1)


async def sample(tiny_float, params: dict, draws: int = DRAWS) -> tuple[list[tuple[int, ...]], int, int, dict, object]:
    sampling = [SamplingParams(seed=i, max_tokens=3, **params) for i in range(draws)]
    config = EngineConfig(speculative=SPEC, runner="device", device="cpu", max_batch_size=16, max_context=DEVICE_CONTEXT)
    async with Engine(tiny_float, config) as engine:
        samples, drafted, accepted = await draw(engine, PROMPT, WORDS, sampling)
        await wait_idle(engine)
        await assert_all_free(engine)
        metrics = await engine.metrics()
        law = await anyio.to_thread.run_sync(target_law, tiny_float, engine, PROMPT, WORDS, 3,
                                             params["temperature"], params.get("top_k"), None)
    return samples, drafted, accepted, law, metrics


def pvalue(samples: list[tuple[int, ...]], law: dict) -> float:
    outcomes = sorted(set(law) | set(samples))
    counts = torch.tensor([samples.count(o) for o in outcomes])
    return chi_square_pvalue(counts, torch.tensor([law.get(o, 0.0) for o in outcomes]))


@pytest.mark.parametrize("name, draws", [("sample", DRAWS), *[pytest.param(n, SOAK_DRAWS, marks=pytest.mark.soak)
                                                               for n in CASES]])
async def test_sampled_model_drafts_sample_the_masked_target_law(tiny_float, name: str, draws: int) -> None:
    samples, drafted, accepted, law, metrics = await sample(tiny_float, CASES[name], draws)
    assert 0 < accepted < drafted, (accepted, drafted)
    # a request prefills in one step and decodes in one or two: most steps mix prompts in (eager)
    assert metrics.replayed_steps > 0, metrics
    assert set(samples) <= set(law), "an outcome the masked target law gives no mass"
    p = pvalue(samples, law)
    assert p > ALPHA / len(CASES), f"{name}: chi-square p = {p:.2e} over {len(law)} outcomes"


async def test_the_test_rejects_verification_that_trusts_the_drafts(tiny_float, monkeypatch) -> None:
    verify = verify_features.verify_step

    def trusting(logits, v, m, vocab, mode, draft_probs=None):
        return verify(logits, v, m, vocab, mode, draft_probs=None if draft_probs is None else draft_probs * 1e-6)

    monkeypatch.setattr(verify_features, "verify_step", trusting)
    samples, _, _, law, _ = await sample(tiny_float, CASES["sample"])
    assert pvalue(samples, law) < ALPHA / len(CASES)
