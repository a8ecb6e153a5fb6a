"""The end-of-request check (grammars/validate.py) refuses every output that breaks its spec."""
from __future__ import annotations

import pytest

from interlock.grammars.validate import validate_output
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import Choice, Ebnf, JsonObject, JsonSchema, Lark, Regex

CITY = {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer", "minimum": 1}},
        "required": ["city"]}


@pytest.mark.parametrize(("spec", "text"), [
    (JsonSchema(CITY), '{"city":"Paris","n":2}'),
    (JsonSchema(CITY, whitespace="flexible"), '{\n  "city": "a\\tb"\n}'),      # an escaped tab is JSON
    (JsonSchema(CITY, strict=False), '{"city":"x","extra":1}'),                # open objects take extra keys
    (JsonSchema({"type": "string", "format": "no-such-format"}), '"anything"'),  # format: an annotation
    (JsonSchema({"type": "string", "format": "date-time"}), '"not a date"'),     # annotation here too
    (JsonSchema({"oneOf": [{"type": "integer"}, {"type": "string"}]}), '3'),
    (JsonObject(), '{"a":[1,{"b":null}]}'),
    (Regex(r"[a-c]+\d"), "abc7"),
    (Choice(["yes", "no"]), "no"),
    (Ebnf('root ::= "x"'), "anything: no independent EBNF parser"),
    (Lark('start: "x"'), "anything: no independent Lark parser"),
], ids=lambda v: type(v).__name__ if not isinstance(v, str) else "")
def test_valid_outputs_pass(spec, text):
    assert validate_output(spec, text) is None


@pytest.mark.parametrize(("spec", "text", "reason"), [
    (JsonSchema(CITY), '{"city":"a\tb"}', "not valid JSON"),                   # raw tab: what xgrammar emits
    (JsonSchema(CITY), '{"city":"a\nb"}', "not valid JSON"),
    (JsonSchema(CITY), '{"city":"Paris"', "not valid JSON"),                   # truncated at max_tokens
    (JsonSchema(CITY), '{"city":"x"} {"city":"y"}', "not valid JSON"),          # two documents
    (JsonSchema(CITY), '', "not valid JSON"),
    (JsonSchema({"type": "number"}), 'NaN', "not valid JSON"),
    (JsonSchema({"type": "number"}), '-Infinity', "not valid JSON"),
    (JsonSchema(CITY), '{"city":"x","city":"y"}', "duplicate key"),
    (JsonSchema(CITY), '{"n":2}', "'required'"),
    (JsonSchema(CITY), '{"city":"x","n":0}', "at n"),
    (JsonSchema(CITY), '{"city":"x","extra":1}', "'additionalProperties'"),   # strict closes objects
    (JsonSchema({"type": "integer", "allOf": [{"minimum": 0}]}), '{}', "'type'"),
    (JsonSchema({"type": "integer", "not": {"const": 3}}), '3', "'not'"),
    (JsonSchema({"oneOf": [{"type": "integer"}, {"minimum": 0}]}), '3', "'oneOf'"),
    (JsonSchema({"type": "array", "contains": {"const": 1}}), '[2]', "'contains'"),
    (JsonSchema({"dependentRequired": {"a": ["b"]}}), '{"a":1}', "'dependentRequired'"),
    (JsonSchema({"$schema": "http://json-schema.org/draft-07/schema#", "dependencies": {"a": ["b"]}}),
     '{"a":1}', "'dependencies'"),
    (JsonSchema({"if": {"minimum": 10}, "then": {"multipleOf": 2}}), '13', "'multipleOf'"),
    (JsonObject(), '[1]', "not an object"),
    (JsonObject(), '{"a":1', "not valid JSON"),
    (Regex(r"[a-c]+\d"), "abc7 ", "does not match"),
    (Choice(["yes", "no"]), "yes ", "not one of"),
])
def test_invalid_outputs_raise_a_grammar_error_with_the_reason(spec, text, reason):
    with pytest.raises(GrammarError, match=reason):
        validate_output(spec, text)


def test_invalid_schema_is_a_grammar_error_not_a_crash():
    with pytest.raises(GrammarError, match="not a valid schema"):
        validate_output(JsonSchema({"type": "no-such-type"}), "1")


def test_deep_nesting_is_a_grammar_error():
    with pytest.raises(GrammarError):
        validate_output(JsonObject(), "{" + '"a":[' * 100_000)
