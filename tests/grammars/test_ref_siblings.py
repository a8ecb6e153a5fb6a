"""Draft-07 `$ref` with sibling keywords: `auto` compiles them with the siblings applied (llguidance),
which the draft ignores. Sound: every instance the grammar takes satisfies the `$ref`, so it is valid
under draft-07; it refuses only instances that break the siblings, which the schema's author meant.
Said at debug level. tests/engine/test_ref_siblings.py checks the engine's outputs."""
from __future__ import annotations

import json
import logging

import jsonschema
import pytest

from interlock.grammars import make_backend
from interlock.protocol.grammar import JsonSchema
from interlock.testing import byte_tokenizer

D7 = "http://json-schema.org/draft-07/schema#"
# `type` and `maximum` beside a $ref: draft-07 reads only the $ref (in the style of real-world schemas,
# where `type` is repeated beside a $ref that already says it)
SCHEMA = {"$schema": D7, "type": "object",
          "definitions": {"option": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]},
                          "level": {"type": "integer", "minimum": 0}},
          "properties": {"main": {"type": "object", "$ref": "#/definitions/option", "description": "d"},
                         "level": {"$ref": "#/definitions/level", "maximum": 3}},
          "required": ["main", "level"]}
TAKEN = [{"main": {"on": True}, "level": 2}, {"main": {"on": False}, "level": 0}]
INVALID = [{"main": {}, "level": 2}, {"main": {"on": True}, "level": -1}, {"main": {"on": True}}]
SIBLING_REFUSES = [{"main": {"on": True}, "level": 9}]           # valid under draft-07, breaks `maximum: 3`


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def auto(tok):
    return make_backend("auto", tok, tok.vocab_size)


class Events(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.mark.parametrize("strict", [True, False])
def test_auto_applies_the_siblings_and_says_so_at_debug(auto, tok, strict):
    logger = logging.getLogger("interlock.grammars.llguidance_backend")
    events, level = Events(), logger.level
    logger.addHandler(events)
    logger.setLevel(logging.DEBUG)
    try:
        compiled = auto.compile(JsonSchema(SCHEMA, strict=strict))
    finally:
        logger.removeHandler(events)
        logger.setLevel(level)
    assert compiled.backend == "llguidance" and not compiled.inexact
    said = [line for line in events.lines if "grammar.ref_siblings_applied" in line]
    assert any("/properties/level" in line and "maximum" in line for line in said), events.lines
    matcher = auto.matcher(compiled)

    def takes(value) -> bool:
        ids = tok.encode(json.dumps(value, separators=(",", ":"))) + [tok.eos_token_ids[0]]
        try:
            return matcher.accept(ids)
        finally:
            matcher.reset()

    draft07 = jsonschema.Draft7Validator(SCHEMA)
    assert all(draft07.is_valid(v) for v in TAKEN + SIBLING_REFUSES) and not any(map(draft07.is_valid, INVALID))
    assert all(map(takes, TAKEN))
    assert not any(map(takes, INVALID)) and not any(map(takes, SIBLING_REFUSES))
