"""SamplingParams.speculative=False: that request gets no drafts of any kind while its neighbours in
the same batch keep drafting, and its output is the same as with drafts (greedy)."""
from __future__ import annotations

import dataclasses

import anyio
import pytest

from interlock.engine import Engine, EngineConfig
from interlock.protocol.errors import InvalidParameterError
from interlock.protocol.sampling import Completion, SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from helpers import GRAMMARS, PROMPTS, assert_all_free, complete_all

SPECS = {
    "ngram+forced": SpeculativeConfig(("ngram", "forced", "suffix"), max_draft_len=3),
    "self-draft+forced": SpeculativeConfig(("self-draft", "forced"), max_draft_len=3, self_draft_layers=1),
}


async def mixed(tiny, speculative: SpeculativeConfig, n: int = 8) -> list[tuple[Completion, Completion]]:
    """Each case twice in one batch: once drafting, once with speculative=False."""
    cases = [(PROMPTS[i % len(PROMPTS)], GRAMMARS[i % len(GRAMMARS)],
              SamplingParams(max_tokens=16 + i % 5, speculative=spec)) for i in range(n) for spec in (True, False)]
    async with Engine(tiny, EngineConfig(speculative=speculative, max_batch_size=2 * n)) as engine:
        out = await complete_all(engine, cases)
        await assert_all_free(engine)
    return list(zip(out[::2], out[1::2]))


@pytest.mark.parametrize("mode", list(SPECS))
def test_off_gets_no_drafts_and_the_same_output_beside_drafting_neighbours(tiny, mode: str) -> None:
    pairs = anyio.run(mixed, tiny, SPECS[mode])
    for on, off in pairs:
        assert off.token_ids == on.token_ids and off.finish_reason == on.finish_reason
        assert off.stats.drafted == 0 and off.stats.accepted == 0
        assert off.stats.mean_acceptance_length == 1.0
    assert sum(on.stats.drafted for on, _ in pairs) > 0                # the neighbours did draft
    assert sum(on.stats.steps for on, _ in pairs) < sum(off.stats.steps for _, off in pairs)


def test_off_on_an_engine_without_speculation_is_the_plain_output(tiny) -> None:
    async def main() -> tuple[Completion, Completion]:
        async with Engine(tiny, EngineConfig(speculative=None)) as engine:
            a = await engine.complete(PROMPTS[0], sampling=SamplingParams(max_tokens=12, speculative=False))
            b = await engine.complete(PROMPTS[0], sampling=SamplingParams(max_tokens=12))
            return a, b

    a, b = anyio.run(main)
    assert a.token_ids == b.token_ids and a.stats.drafted == b.stats.drafted == 0


def test_speculative_must_be_a_bool() -> None:
    with pytest.raises(InvalidParameterError) as e:
        dataclasses.replace(SamplingParams(), speculative=1)
    assert e.value.field == "speculative"
