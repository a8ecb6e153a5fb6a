"""A draft-07 schema whose `$ref`s have sibling keywords runs through the engine with the default
backend (`auto`, which applies the siblings: tests/grammars/test_ref_siblings.py), and every output
validates under draft-07's own semantics (and keeps the siblings too)."""
from __future__ import annotations

import json

import jsonschema

from interlock.engine import Engine
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import SamplingParams

from helpers import assert_all_free, complete_all, config

D7 = "http://json-schema.org/draft-07/schema#"
SCHEMA = {"$schema": D7, "type": "object",
          "definitions": {"option": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]},
                          "level": {"type": "integer", "minimum": 0}},
          "properties": {"main": {"type": "object", "$ref": "#/definitions/option"},
                         "level": {"$ref": "#/definitions/level", "maximum": 3}},
          "required": ["main", "level"]}


async def test_outputs_validate_under_draft_07(tiny) -> None:
    cases = [("JSON please", JsonSchema(SCHEMA), SamplingParams(temperature=1.0, seed=seed, max_tokens=48))
             for seed in range(8)]
    async with Engine(tiny, config(8)) as engine:
        done = await complete_all(engine, cases)
        await assert_all_free(engine)
    finished = [json.loads(c.text) for c in done if c.finish_reason == "stop"]
    assert finished, [c.text for c in done]
    for value in finished:
        jsonschema.Draft7Validator(SCHEMA).validate(value)
        assert value["level"] <= 3                        # the sibling `maximum` held as well
