"""The end-of-request check: a constrained request never ends with "stop" and an invalid document.
An output the check refuses fails that request alone with GrammarError (and an error log); its
neighbours finish with exactly their solo outputs, and everything is freed."""
from __future__ import annotations

import json
import logging

import anyio
import jsonschema
import pytest

from interlock.engine import Engine
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import JsonObject, JsonSchema
from interlock.protocol.sampling import SamplingParams

from helpers import assert_all_free, config, wait_idle

TERMINATING = SamplingParams(max_tokens=64)
# Every value bounded, so even the random tiny model completes the document within max_tokens.
SMALL = {"type": "object", "properties": {"a": {"enum": [1, 22, 333]}, "b": {"type": "boolean"},
                                          "c": {"enum": ["x", "yy"]}},
         "required": ["a", "b", "c"], "additionalProperties": False}


async def test_valid_outputs_pass_and_a_cut_document_is_a_grammar_error(tiny, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="interlock")
    async with Engine(tiny, config(4)) as engine:
        solo = await engine.complete("JSON please", grammar=JsonSchema(SMALL), sampling=TERMINATING)
        assert solo.finish_reason == "stop"
        jsonschema.validate(json.loads(solo.text), SMALL)
        results: dict[str, object] = {}

        async def cut() -> None:
            # A stop string ends the output inside the object: what the user would get is not JSON.
            with pytest.raises(GrammarError, match="not valid JSON"):
                await engine.complete("JSON please", grammar=JsonSchema(SMALL),
                                      sampling=SamplingParams(max_tokens=64, stop=(":",)))
            results["cut"] = "GrammarError"

        async def neighbour() -> None:
            results["neighbour"] = await engine.complete("JSON please", grammar=JsonSchema(SMALL),
                                                         sampling=TERMINATING)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(cut)
                tg.start_soon(neighbour)
        assert results["cut"] == "GrammarError"
        assert "invalid_constrained_output" in caplog.text            # and an error log says why
        assert results["neighbour"].token_ids == solo.token_ids
        await wait_idle(engine)
        await assert_all_free(engine)


async def test_json_object_outputs_are_checked_too(tiny) -> None:
    async with Engine(tiny, config(2)) as engine:
        with pytest.raises(GrammarError):
            await engine.complete("JSON please", grammar=JsonObject(),
                                  sampling=SamplingParams(max_tokens=48, stop=("{",)))
        await wait_idle(engine)
        await assert_all_free(engine)
