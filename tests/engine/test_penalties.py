"""Repetition remedies through the engine: the plain greedy output equals a direct token-by-token
reference with the documented counts, speculation never changes a penalized greedy output (every
drafter, grammar on and off), and penalized stochastic speculation samples exactly the penalized,
masked target law (chi-square)."""
from __future__ import annotations

import anyio
import pytest
import torch

from interlock.drafters.model import DraftLM
from interlock.engine import Engine, EngineConfig
from interlock.kernels.penalties_reference import apply_penalties_reference
from interlock.protocol.grammar import JsonSchema, Regex
from interlock.protocol.sampling import Completion, SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from chi_square import chi_square_pvalue
from helpers import SCHEMA, assert_all_free, complete_all, wait_idle
from laws import first_two_law, logits_after

PENALTIES = dict(presence_penalty=0.5, frequency_penalty=1.5, repetition_penalty=1.3)
PROMPTS = ["abc abc abc abc", "Once upon a time", "JSON please", "one two one two one two"]
GRAMMARS = [None, JsonSchema(SCHEMA), Regex(r"[a-z]{3,9}( [a-z]{2,5}){0,5}")]


def _reference(tiny, prompt: str, max_tokens: int) -> list[int]:
    """Greedy, one token at a time, penalties from first principles: repetition over prompt +
    output ids, frequency/presence over output ids."""
    tok = tiny.tokenizer
    ids = tok.encode_prompt(prompt)
    out: list[int] = []
    v = tiny.config.vocab_size
    for _ in range(max_tokens):
        logits = logits_after(tiny, ids, out)[-1:].float()
        counts = torch.zeros(1, v, dtype=torch.long)
        for t in out:
            counts[0, t] += 1
        prompt_mask = torch.zeros(1, v, dtype=torch.bool)
        prompt_mask[0, ids] = True
        x = apply_penalties_reference(logits, counts, prompt_mask, torch.tensor([PENALTIES["presence_penalty"]]),
                                      torch.tensor([PENALTIES["frequency_penalty"]]),
                                      torch.tensor([PENALTIES["repetition_penalty"]]))
        x[:, tok.vocab_size:] = float("-inf")
        t = int(x.argmax())
        out.append(t)
        if t in tok.eos_token_ids:
            break
    return out


async def _outputs(tiny, speculative: SpeculativeConfig | None, sampling: SamplingParams
                   ) -> list[Completion]:
    cases = [(PROMPTS[i % len(PROMPTS)], GRAMMARS[i % len(GRAMMARS)], sampling)
             for i in range(len(PROMPTS) * len(GRAMMARS))]
    async with Engine(tiny, EngineConfig(speculative=speculative, max_batch_size=4)) as engine:
        out = await complete_all(engine, cases)
        await wait_idle(engine)
        await assert_all_free(engine)
    return out


async def test_plain_greedy_penalized_output_equals_the_direct_reference(tiny) -> None:
    sampling = SamplingParams(max_tokens=16, **PENALTIES)
    async with Engine(tiny, EngineConfig(speculative=None, max_batch_size=1)) as engine:
        for prompt in PROMPTS[:2]:
            got = await engine.complete(prompt, sampling=sampling)
            want = await anyio.to_thread.run_sync(_reference, tiny, prompt, 16)
            assert list(got.token_ids) == want
            plain = await engine.complete(prompt, sampling=SamplingParams(max_tokens=16))
            assert plain.token_ids != got.token_ids, "the penalties should change this output"


SPECULATIVE = {
    "ngram": SpeculativeConfig(("ngram",), max_draft_len=3),
    "forced": SpeculativeConfig(("forced",), max_draft_len=3),
    "ngram+forced": SpeculativeConfig(("ngram", "forced"), max_draft_len=3),
    "self-draft": SpeculativeConfig.parse("self-draft:1+forced", max_draft_len=3),
}


# Discouraging repeats (the usual use), and encouraging them: then drafts repeat tokens and a
# verify position's counts include the drafts before it, which a wrong count would miss.
SETTINGS = [PENALTIES, dict(presence_penalty=-0.6, frequency_penalty=-0.3, repetition_penalty=0.8)]


@pytest.mark.parametrize("setting", [0, 1])
@pytest.mark.parametrize("mode", list(SPECULATIVE))
async def test_greedy_speculative_equals_greedy_plain_with_penalties(tiny, mode: str, setting: int) -> None:
    sampling = SamplingParams(max_tokens=24, **SETTINGS[setting])
    plain = await _outputs(tiny, None, sampling)
    spec = await _outputs(tiny, SPECULATIVE[mode], sampling)
    for i, (want, have) in enumerate(zip(plain, spec)):
        assert have.token_ids == want.token_ids, f"case {i} differs under {mode}"
        assert have.finish_reason == want.finish_reason
    assert sum(c.stats.accepted for c in spec) > 0, "some drafts must be accepted for the test to mean anything"


STAT_PROMPT = "Once upon a time"
STAT_GRAMMAR = Regex(r"[a-z]{3,9}( [a-z]{2,5}){0,3}")
STRONG = dict(presence_penalty=2.0, frequency_penalty=2.0, repetition_penalty=3.0)
DRAWS, ALPHA = 1000, 1e-3


async def test_stochastic_speculation_with_penalties_samples_the_penalized_masked_law(tiny) -> None:
    speculative = SpeculativeConfig(("draft",), max_draft_len=2, draft_lm=DraftLM.full(tiny.model))
    async with Engine(tiny, EngineConfig(speculative=speculative, max_batch_size=8)) as engine:
        completions = await complete_all(engine, [(STAT_PROMPT, STAT_GRAMMAR, SamplingParams(
            temperature=1.0, top_k=3, seed=i, max_tokens=2, **STRONG)) for i in range(DRAWS)], timeout_s=300, concurrency=8)
        await assert_all_free(engine)
        law = await anyio.to_thread.run_sync(lambda: first_two_law(tiny, engine, STAT_PROMPT, STAT_GRAMMAR,
                                                                   top_k=3, penalties=STRONG))
        unpenalized = await anyio.to_thread.run_sync(lambda: first_two_law(tiny, engine, STAT_PROMPT, STAT_GRAMMAR,
                                                                           top_k=3))
    samples = [c.token_ids for c in completions]
    drafted, accepted = sum(c.stats.drafted for c in completions), sum(c.stats.accepted for c in completions)
    assert 0 < accepted < drafted, "drafts should be both accepted and rejected"
    assert all(len(s) == 2 for s in samples)
    assert set(samples) <= set(law), "a token outside the penalized, masked top-k support was emitted"
    outcomes = sorted(set(law) | set(unpenalized))
    counts = torch.tensor([samples.count(o) for o in outcomes])
    assert chi_square_pvalue(counts, torch.tensor([law.get(o, 0.0) for o in outcomes])) > ALPHA
    assert chi_square_pvalue(counts, torch.tensor([unpenalized.get(o, 0.0) for o in outcomes])) < ALPHA
