"""A request chooses its grammar backend (`grammar_backend=`): each one compiles with that backend,
in that backend's compile cache, and its output is valid; other requests keep the engine's."""
from __future__ import annotations

import json

import anyio
import jsonschema
import pytest

from interlock.engine import Engine, EngineConfig
from interlock.protocol.errors import InvalidParameterError
from interlock.protocol.grammar import GrammarConfig, JsonSchema, Reasoning
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from helpers import SCHEMA, assert_all_free

CHOICES = [None, "auto", "xgrammar", "llguidance"]
# short documents, so that sampled outputs of the tiny random model finish
SHORT = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                          "n": {"type": "integer", "minimum": 0, "maximum": 9}},
         "required": ["city", "n"], "additionalProperties": False}


@pytest.mark.parametrize("engine_backend", ["xgrammar", "llguidance"])
def test_each_request_compiles_with_its_backend_and_validates(tiny, engine_backend: str) -> None:
    config = EngineConfig(speculative=SpeculativeConfig(("ngram", "forced"), max_draft_len=3),
                          grammar=GrammarConfig(backend=engine_backend), max_batch_size=8)
    grammar = JsonSchema(SHORT)

    async def main() -> tuple[dict, dict]:
        async with Engine(tiny, config) as engine:
            out: dict = {}

            async def one(name: str | None, seed: int) -> None:
                out[name, seed] = await engine.complete("JSON please", grammar=grammar, grammar_backend=name,
                                                        sampling=SamplingParams(temperature=1.0, seed=seed,
                                                                                max_tokens=64))

            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    for name in CHOICES:
                        for seed in range(2):
                            tg.start_soon(one, name, seed)
            compiled = {name: (await engine.grammars.compile(grammar, name)).backend for name in CHOICES}
            await assert_all_free(engine)
            return out, compiled

    out, compiled = anyio.run(main)
    for c in out.values():
        assert c.finish_reason in ("stop", "length")
        if c.finish_reason == "stop":
            jsonschema.validate(json.loads(c.text), SHORT)
    assert sum(c.finish_reason == "stop" for c in out.values()) >= len(out) // 2
    assert compiled["xgrammar"] == "xgrammar" and compiled["llguidance"] == "llguidance"
    assert compiled[None] == engine_backend                        # None: the engine's own
    assert compiled["auto"] in ("xgrammar", "llguidance")


def test_switch_grammar_with_a_chosen_backend_and_cache_keys(tiny) -> None:
    """A Reasoning grammar compiled by a backend the engine was not built with still gets a matcher;
    the same spec compiled by two backends is two cache entries, asked twice is a hit."""
    async def main():
        async with Engine(tiny, EngineConfig(grammar=GrammarConfig(backend="xgrammar"))) as engine:
            spec = Reasoning(then=JsonSchema(SCHEMA))
            c = await engine.complete("think, then JSON", grammar=spec, grammar_backend="llguidance",
                                      sampling=SamplingParams(max_tokens=32))
            a = await engine.grammars.compile(JsonSchema(SCHEMA), "llguidance")
            b = await engine.grammars.compile(JsonSchema(SCHEMA), "xgrammar")
            again = await engine.grammars.compile(JsonSchema(SCHEMA), "llguidance")
            await assert_all_free(engine)
            return c, a, b, again

    c, a, b, again = anyio.run(main)
    assert c.finish_reason in ("stop", "length") and c.token_ids
    assert a.backend == "llguidance" and b.backend == "xgrammar" and again is a


def test_unknown_backend_is_a_typed_error_naming_it(tiny) -> None:
    async def main() -> None:
        async with Engine(tiny, EngineConfig()) as engine:
            with pytest.raises(InvalidParameterError) as e:
                await engine.complete("hi", grammar=JsonSchema(SCHEMA), grammar_backend="outlines")
            assert e.value.field == "grammar_backend" and "outlines" in str(e.value)
            await engine.complete("hi", grammar=JsonSchema(SCHEMA), sampling=SamplingParams(max_tokens=4))

    anyio.run(main)
