"""law="conditional" through the whole engine, on the tiny model and grammars whose outputs are few
enough to score every one (laws.complete_laws): the accepted outputs follow P(x | x in L), with and
without speculation (n-gram + grammar-forced point-mass drafts, a draft model's sampled drafts);
the masked law follows its own enumeration, and the two laws are told apart by the same test. The
attempts are reported per request and in Engine.metrics(), and fall below plain rejection's
1 / P(L) as the trie learns. What the law refuses, it refuses by name.

Each chi-square runs at ALPHA over a few hundred seeded draws (fixed seeds: the same result every run).
"""
from __future__ import annotations

import anyio
import pytest
import torch

from interlock.engine import Engine, EngineConfig
from interlock.protocol.errors import ConditionalAttemptsError, InvalidParameterError, UnsupportedFeatureError
from interlock.protocol.grammar import Regex
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from chi_square import chi_square_pvalue
from helpers import assert_all_free, complete_all, wait_idle
from laws import complete_laws

ALPHA = 1e-3
DRAWS = 300
PROMPT = "Once upon"
UNITS = Regex(r"(ab|a|b){1,3}")         # 75 tokenizations; masked law ~ aaa / bbb / aaab, conditional ~ b / bb / bbb
BANG = Regex(r"(ab|a|b){1,2}!")         # "!" is forced after two units: a forced draft that is no longer free
TEMPERATURE = 2.0
CASES = {
    "plain": (None, UNITS),
    "ngram+forced": (SpeculativeConfig(("ngram", "forced"), max_draft_len=3), BANG),
    "self-draft": (SpeculativeConfig(("self-draft",), max_draft_len=3, self_draft_layers=1), UNITS),
}


async def _draw(engine: Engine, grammar, law: str, draws: int = DRAWS) -> list:
    """Completions of `draws` seeded requests, 16 at a time."""
    return await complete_all(engine, [(PROMPT, grammar, SamplingParams(
        temperature=TEMPERATURE, seed=i, max_tokens=8, law=law)) for i in range(draws)], timeout_s=600, concurrency=16)


def _pvalue(samples: list[tuple[int, ...]], law: dict) -> float:
    outcomes = sorted(set(law) | set(samples))
    return chi_square_pvalue(torch.tensor([samples.count(o) for o in outcomes]),
                             torch.tensor([law.get(o, 0.0) for o in outcomes]))


@pytest.mark.parametrize("name", CASES)
async def test_conditional_samples_follow_the_enumerated_conditional_law(tiny, name: str) -> None:
    spec, grammar = CASES[name]
    async with Engine(tiny, EngineConfig(speculative=spec, max_batch_size=16)) as engine:
        done = await _draw(engine, grammar, "conditional")
        await wait_idle(engine)
        await assert_all_free(engine)
        metrics = await engine.metrics()
        masked, conditional, _ = await anyio.to_thread.run_sync(complete_laws, tiny, engine, PROMPT, grammar,
                                                                TEMPERATURE)
    samples = [c.token_ids for c in done]
    assert all(c.finish_reason == "stop" for c in done)
    assert _pvalue(samples, conditional) > ALPHA / len(CASES)
    assert _pvalue(samples, masked) < 1e-6                  # a different law: the test tells them apart
    attempts = sum(c.stats.attempts for c in done)
    assert metrics.conditional_requests == DRAWS and metrics.conditional_attempts == attempts
    assert metrics.conditional_rejected_tokens == sum(c.stats.rejected_tokens for c in done) > 0
    if spec is not None:
        assert sum(c.stats.drafted for c in done) > 0      # the accepted attempts did speculate


async def test_masked_samples_follow_the_masked_law_and_attempts_beat_plain_rejection(tiny) -> None:
    async with Engine(tiny, EngineConfig(speculative=None, max_batch_size=16)) as engine:
        masked_done = await _draw(engine, UNITS, "masked")
        cond_done = await _draw(engine, UNITS, "conditional")
        masked, conditional, p_l = await anyio.to_thread.run_sync(complete_laws, tiny, engine, PROMPT, UNITS,
                                                                  TEMPERATURE)
    samples = [c.token_ids for c in masked_done]
    assert all(c.stats.attempts == 1 and c.stats.rejected_tokens == 0 for c in masked_done)
    assert _pvalue(samples, masked) > ALPHA
    assert _pvalue(samples, conditional) < 1e-6
    mean_attempts = sum(c.stats.attempts for c in cond_done) / len(cond_done)
    assert mean_attempts < 0.7 / p_l, (mean_attempts, 1 / p_l)      # plain rejection: 1 / P(L) on average


async def test_what_the_conditional_law_refuses_it_refuses_by_name(tiny, tiny_float) -> None:
    with pytest.raises(InvalidParameterError, match="temperature 0"):
        SamplingParams(law="conditional")
    for extra in ({"logprobs": 1}, {"stop": ["x"]}, {"ignore_eos": True}):
        with pytest.raises(InvalidParameterError, match="law='conditional'"):
            SamplingParams(temperature=1.0, law="conditional", **extra)
    with pytest.raises(InvalidParameterError, match="law"):
        SamplingParams(temperature=1.0, law="exact")
    with pytest.raises(InvalidParameterError, match="max_attempts"):
        SamplingParams(temperature=1.0, law="conditional", max_attempts=0)
    conditional = SamplingParams(temperature=1.0, law="conditional", max_tokens=8, seed=0)
    async with Engine(tiny, EngineConfig(speculative=None)) as engine:
        with pytest.raises(InvalidParameterError, match="conditions on a grammar"):
            await engine.complete(PROMPT, sampling=conditional)
        # an output the model all but never writes: one attempt is not enough (a typed error, not the masked law)
        with pytest.raises(ConditionalAttemptsError, match="after 2 attempts"):
            await engine.complete(PROMPT, grammar=Regex("zqzqzqz"), sampling=SamplingParams(
                temperature=1.0, law="conditional", max_tokens=12, seed=0, max_attempts=2))
        ok = await engine.complete(PROMPT, grammar=UNITS, sampling=conditional)    # the engine goes on
        assert ok.finish_reason == "stop" and ok.stats.attempts >= 1
        await wait_idle(engine)
        await assert_all_free(engine)
    async with Engine(tiny_float, EngineConfig(speculative=None, runner="device", device="cpu")) as engine:
        with pytest.raises(UnsupportedFeatureError, match="law='conditional'"):
            await engine.complete(PROMPT, grammar=UNITS, sampling=conditional)
