"""Native switching grammars (`native=True`) through the engine: greedy speculative output equals
greedy plain output token for token across the switch, on each backend with n-gram, forced and
draft-model drafts; completed outputs validate (the engine's end-of-request check would fail them otherwise).

The tiny preset's marker is its own first greedy token (as in test_switch_engine.py); the SmolLM2
case is the few-shot tool-call workload of test_switch_forced.py, where forced drafts resume after
the trigger on the native grammar too.
"""
from __future__ import annotations

import pytest

from interlock.grammars.validate import validate_output
from interlock.protocol.grammar import JsonSchema, Reasoning, StructuralTag, Tag
from interlock.protocol.sampling import SamplingParams

from helpers import SWITCH_PROMPT, SWITCH_SCHEMA, complete_switch, first_greedy_token_text

PROMPT = SWITCH_PROMPT
MODES = ["ngram+forced", "self-draft+forced"]     # (each drafter alone: test_switch_engine.py, composing)
SCHEMA = SWITCH_SCHEMA
GREEDY = SamplingParams(temperature=0.0, max_tokens=40)


@pytest.fixture(scope="module")
def marker(tiny) -> str:
    return first_greedy_token_text(tiny)


async def outputs(model, prompt, spec, mode: str | None, backend: str, sampling=GREEDY):
    return await complete_switch(model, prompt, spec, mode, backend, sampling)


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("name", ["reasoning", "tags"])
async def test_native_greedy_speculative_equals_plain(tiny, marker, name, backend):
    spec = {"reasoning": Reasoning(then=JsonSchema(SCHEMA), end=marker, native=True),
            "tags": StructuralTag([marker], [Tag(marker, JsonSchema(SCHEMA), "</call>")], native=True)}[name]
    plain = await outputs(tiny, PROMPT, spec, None, backend)
    whole = tiny.tokenizer.decode(list(plain.token_ids))
    assert marker in whole and plain.finish_reason in ("stop", "length")
    if plain.finish_reason == "stop":
        validate_output(spec, whole)
    assert '{"n":' in whole                                    # the constrained part began
    drafted = 0
    for mode in MODES:
        got = await outputs(tiny, PROMPT, spec, mode, backend)
        assert got.token_ids == plain.token_ids, f"{mode} differs"
        assert got.finish_reason == plain.finish_reason
        drafted += got.stats.drafted
    assert drafted > 0


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
async def test_native_forced_drafts_after_the_trigger(smollm, backend):
    from test_switch_forced import PROMPT as CALL_PROMPT, SCHEMA as CALL_SCHEMA    # (conftest: on sys.path)

    spec = StructuralTag(["CALL:"], [Tag("CALL:", JsonSchema(CALL_SCHEMA), "\n")], at_most=1, native=True)
    plain = await outputs(smollm, CALL_PROMPT, spec, None, backend)
    assert " CALL:{" in plain.text and plain.finish_reason == "stop", plain.text
    validate_output(spec, plain.text)
    forced = await outputs(smollm, CALL_PROMPT, spec, "forced", backend)
    assert forced.token_ids == plain.token_ids
    assert forced.stats.drafted > 0 and forced.stats.accepted == forced.stats.drafted
