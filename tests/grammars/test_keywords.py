"""The keyword table (grammars/LENIENCY.md, grammars/keywords.py) is true of the real backends.

One small schema per keyword, with instances that must be accepted and instances that must be
refused. For each backend the observed behaviour must be the one the table states:
  exact   - compiles; every valid instance accepted, every invalid one refused;
  refused - compile raises GrammarError;
  loose   - compiles, yet accepts an invalid instance or refuses a valid one.
Then the checker must be sound: wherever a backend is loose, the compiled grammar says so
(`inexact`), so `auto` never hands out a loose grammar for a strict spec; and `auto` itself is
exact on every probe or raises SchemaKeywordError naming the keyword. One kind of looseness is
policy, not a gap: a draft-07 `$ref` with siblings ("siblings" in auto's column). llguidance
applies the siblings, which the draft ignores; every output still satisfies the `$ref`, so it is
valid under draft-07, and only instances that break the siblings are refused.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from interlock.grammars import make_backend
from interlock.grammars.keywords import gaps, ref_siblings
from interlock.grammars.validate import validate_output
from interlock.protocol.errors import GrammarError, SchemaKeywordError
from interlock.protocol.grammar import JsonSchema
from interlock.testing import byte_tokenizer

D7 = "http://json-schema.org/draft-07/schema#"
# id -> (schema, valid instances, invalid instances, xgrammar, llguidance, auto's named keyword or
# "exact"). Instances are checked with jsonschema first, so a wrong label fails here, not silently.
PROBES: dict[str, tuple] = {
    "type beside allOf": ({"type": "integer", "allOf": [{"minimum": 0}]}, [3], [{}, "s", -1],
                          "loose", "exact", "exact"),
    "type beside anyOf": ({"type": "integer", "anyOf": [{"minimum": 0}, {"maximum": -10}]}, [3], ["s", -5],
                          "loose", "exact", "exact"),
    "type beside oneOf": ({"type": "integer", "oneOf": [{"minimum": 0}, {"maximum": -10}]}, [3], ["s", -5],
                          "loose", "refused", "oneOf"),
    "type beside $ref": ({"$defs": {"a": {"minimum": 0}}, "type": "integer", "$ref": "#/$defs/a"}, [3], ["s", -1],
                         "loose", "exact", "exact"),
    "properties beside anyOf": ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                                 "anyOf": [{"required": ["b"]}, {"required": ["c"]}]},
                                [{"a": 1, "b": 1}], [{"a": 1}, {"b": 1}], "loose", "exact", "exact"),
    "$ref": ({"$defs": {"a": {"type": "integer", "minimum": 0}}, "$ref": "#/$defs/a"}, [3], ["s", -1],
             "exact", "exact", "exact"),
    "$ref recursive": ({"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}}},
                        "$ref": "#/$defs/n"}, [{"c": {"c": {}}}], [{"c": 1}], "exact", "exact", "exact"),
    "$ref siblings, draft-07": ({"$schema": D7, "definitions": {"a": {"type": "integer"}}, "$ref": "#/definitions/a",
                                 "minimum": 5}, [3, 7], ["s"], "exact", "loose", "siblings"),
    "allOf, one branch": ({"allOf": [{"type": "integer", "minimum": 0}]}, [1], [-1, "s"], "exact", "exact", "exact"),
    "allOf, several branches": ({"allOf": [{"type": "integer"}, {"minimum": 0}]}, [3], ["s", -1],
                                "loose", "exact", "exact"),
    "anyOf": ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, [3, "s"], [True, None], "exact", "exact", "exact"),
    "oneOf, overlapping": ({"oneOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 10}]},
                           [-5, 20], [5], "loose", "refused", "oneOf"),
    "oneOf, disjoint": ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, [3, "s"], [True],
                        "exact", "exact", "exact"),
    "not": ({"type": "integer", "not": {"const": 3}}, [4], [3], "loose", "refused", "not"),
    "not, alone": ({"not": {"type": "string"}}, [4], ["s"], "loose", "refused", "not"),
    "if/then/else": ({"if": {"minimum": 10}, "then": {"multipleOf": 2}, "else": {"maximum": 5}}, [12, 4], [13, 7],
                     "loose", "refused", "if"),
    "contains": ({"type": "array", "contains": {"const": 1}}, [[1], [2, 1]], [[], [2]], "loose", "refused",
                 "contains"),
    "maxContains": ({"type": "array", "contains": {"const": 1}, "maxContains": 1}, [[1]], [[1, 1]],
                    "loose", "refused", "contains"),
    "dependencies (draft-07)": ({"$schema": D7, "type": "object", "properties": {"a": {}, "b": {}},
                                 "dependencies": {"a": ["b"]}}, [{"a": 1, "b": 2}, {}], [{"a": 1}],
                                "loose", "refused", "dependencies"),
    "dependentRequired": ({"type": "object", "properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["b"]}},
                          [{"a": 1, "b": 2}, {}], [{"a": 1}], "loose", "refused", "dependentRequired"),
    "dependentSchemas": ({"type": "object", "properties": {"a": {}, "b": {}},
                          "dependentSchemas": {"a": {"required": ["b"]}}}, [{"a": 1, "b": 2}, {}], [{"a": 1}],
                         "loose", "refused", "dependentSchemas"),
    "uniqueItems": ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [[1, 2]], [[1, 1]],
                    "loose", "refused", "uniqueItems"),
    "unevaluatedProperties": ({"type": "object", "properties": {"a": {"type": "integer"}},
                               "unevaluatedProperties": False}, [{"a": 1}], [{"b": 1}],
                              "loose", "refused", "unevaluatedProperties"),
    "multipleOf, integer": ({"type": "integer", "multipleOf": 3}, [6], [5], "exact", "exact", "exact"),
    "multipleOf, number": ({"type": "number", "multipleOf": 0.5}, [1.5], [1.2], "loose", "exact", "exact"),
    "required, undeclared key": ({"type": "object", "required": ["a"]}, [{"a": 1}], [{}, {"b": 1}],
                                 "loose", "exact", "exact"),
    "minProperties beside optional properties": ({"type": "object", "properties": {"a": {"type": "integer"}},
                                                  "minProperties": 2, "additionalProperties": {"type": "integer"}},
                                                 [{"a": 1, "b": 2}], [{"a": 1}, {}], "exact", "refused", "exact"),
    "maxProperties": ({"type": "object", "maxProperties": 1}, [{"a": 1}], [{"a": 1, "b": 2}],
                      "exact", "exact", "exact"),
    "patternProperties": ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}}, [{"xa": 1}],
                          [{"xa": "s"}], "loose", "exact", "exact"),
    "propertyNames": ({"type": "object", "propertyNames": {"maxLength": 2}}, [{"ab": 1}], [{"abc": 1}],
                      "exact", "refused", "propertyNames"),
    "pattern, anchored": ({"type": "string", "pattern": "^a+$"}, ["aa"], ["b", "ab"], "exact", "exact", "exact"),
    "pattern, unanchored": ({"type": "string", "pattern": "a"}, ["bab"], ["b"], "loose", "exact", "exact"),
    "prefixItems": ({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
                    [[1, "s"]], [["s", 1], [1, "s", 2]], "exact", "exact", "exact"),
    "items, draft-04 array form": ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "array",
                                    "items": [{"type": "integer"}], "additionalItems": False}, [[1]], [["s"], [1, 2]],
                                   "refused", "exact", "exact"),
    "exclusiveMinimum, draft-04 boolean": ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "number",
                                            "minimum": 1, "exclusiveMinimum": True}, [2], [1],
                                           "refused", "exact", "exact"),
    "minimum/maximum, floats": ({"type": "number", "minimum": 0.5, "maximum": 2.5}, [0.5, 1, 2.5], [0.4, 2.6],
                                "exact", "exact", "exact"),
    "minLength/maxLength": ({"type": "string", "minLength": 1, "maxLength": 2}, ["a", '"', "\n"], ["", "abc"],
                            "loose", "exact", "exact"),
    "string without bounds": ({"type": "string"}, ["a", '"', "\n", "\u00e9"], [1], "exact", "exact", "exact"),
    "enum/const": ({"enum": [1, "a", None, {"a": 1}]}, [1, "a", None, {"a": 1}], [2, {"a": 2}],
                   "exact", "exact", "exact"),
    "format, unknown (annotation)": ({"type": "string", "format": "no-such-format"}, ["anything"], [1],
                                     "exact", "exact", "exact"),
    "format, url (not a JSON Schema format)": ({"type": "string", "format": "url"}, ["not a url"], [1],
                                               "exact", "exact", "exact"),
    "format, date-time (enforced)": ({"type": "string", "format": "date-time"}, ["2020-01-01T00:00:00Z"], [1],
                                     "exact", "exact", "exact"),
    "annotations": ({"type": "string", "title": "t", "description": "d", "default": "x", "examples": ["y"],
                     "readOnly": True, "deprecated": True, "contentEncoding": "base64", "nullable": True},
                    ["s"], [1, None], "exact", "exact", "exact"),
    "true schema": (True, [1, "s", {"a": [], "b": 2}], [], "exact", "exact", "exact"),
    "object without properties": ({"type": "object"}, [{"a": 1, "b": 2}], [[]], "exact", "exact", "exact"),
    "array without items": ({"type": "array"}, [[1, 2]], [{}], "exact", "exact", "exact"),
    "open object, nested value": ({"type": "object", "properties": {"a": {"type": "integer"}}},
                                  [{"a": 1, "b": [1, 2]}], [{"a": "s"}], "exact", "exact", "exact"),
    "empty subschema": ({"type": "object", "properties": {"x": {}}, "additionalProperties": False},
                        [{"x": {"a": 1, "b": 2}}], [{"y": 1}], "exact", "exact", "exact"),
    "closed object, typed items": ({"type": "object", "properties": {"x": {"type": "array", "items": {
        "type": "integer"}}}, "additionalProperties": False}, [{"x": [1, 2]}], [{"x": ["s"]}],
        "exact", "exact", "exact"),
}
BACKENDS = ("xgrammar", "llguidance")


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def backends(tok):
    return {n: make_backend(n, tok, tok.vocab_size) for n in (*BACKENDS, "auto")}


def accepted(backend, tok, schema, values) -> list[bool]:
    """Whether the backend's grammar for schema takes each value (compact JSON, then EOS)."""
    matcher = backend.matcher(backend.compile(JsonSchema(schema, strict=False)))

    def accepts(value) -> bool:
        ids = tok.encode(json.dumps(value, separators=(",", ":"), ensure_ascii=False)) + [tok.eos_token_ids[0]]
        try:
            return matcher.accept(ids)
        finally:
            matcher.reset()

    return [accepts(v) for v in values]


def observed(backend, tok, schema, valid, invalid) -> str:
    try:
        takes = accepted(backend, tok, schema, [*valid, *invalid])
    except GrammarError:
        return "refused"
    ok = all(takes[:len(valid)]) and not any(takes[len(valid):])
    return "exact" if ok else "loose"


@pytest.mark.parametrize("probe", PROBES)
def test_labels_agree_with_jsonschema(probe):
    schema, valid, invalid, *_ = PROBES[probe]
    for value in valid:
        validate_output(JsonSchema(schema, strict=False), json.dumps(value))
    for value in invalid:
        with pytest.raises(GrammarError):
            validate_output(JsonSchema(schema, strict=False), json.dumps(value))


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("probe", PROBES)
def test_backend_behaves_as_the_table_says(probe, backend_name, backends, tok):
    schema, valid, invalid, xgr, llg, _ = PROBES[probe]
    expected = {"xgrammar": xgr, "llguidance": llg}[backend_name]
    assert observed(backends[backend_name], tok, schema, valid, invalid) == expected


LOOSE = [(probe, name) for probe, row in PROBES.items() for name, label in zip(BACKENDS, row[3:5]) if label == "loose"]


@pytest.mark.parametrize(("probe", "backend_name"), LOOSE)
def test_the_checker_flags_every_loose_grammar(probe, backend_name, backends, tok):
    """Soundness: a grammar the table calls loose on the probe (test_backend_behaves_as_the_table_says
    holds the label to the backend) says so in `inexact`, or, by policy, takes no invalid value."""
    schema, valid, invalid, *_ = PROBES[probe]
    if backend_name == "llguidance" and ref_siblings(schema):      # policy: sound, see the module docstring
        assert not any(accepted(backends[backend_name], tok, schema, invalid))
    else:
        compiled = backends[backend_name].compile(JsonSchema(schema, strict=False))
        assert compiled.inexact, f"{backend_name} is loose on {probe!r} yet reports no inexact warning"


@pytest.mark.parametrize("probe", PROBES)
def test_auto_is_exact_or_names_the_keyword(probe, backends, tok):
    schema, valid, invalid, *_, auto = PROBES[probe]
    if auto == "exact":
        assert observed(backends["auto"], tok, schema, valid, invalid) == "exact"
        return
    if auto == "siblings":
        compiled = backends["auto"].compile(JsonSchema(schema, strict=False))
        assert compiled.backend == "llguidance" and not compiled.inexact
        takes = accepted(backends["auto"], tok, schema, [*valid, *invalid])
        keeps_siblings = [v for v in valid if jsonschema_valid(schema, v, siblings=True)]
        assert not any(takes[len(valid):]) and all(t for v, t in zip(valid, takes) if v in keeps_siblings)
        return
    with pytest.raises(SchemaKeywordError) as info:
        backends["auto"].compile(JsonSchema(schema, strict=False))
    assert info.value.keyword == auto and f"'{auto}'" in str(info.value)
    assert "lenient=True" in str(info.value)


def jsonschema_valid(schema, value, *, siblings: bool = False) -> bool:
    """jsonschema's verdict; siblings=True reads the schema as 2020-12 does (keywords beside $ref apply)."""
    import jsonschema

    if siblings:
        schema = {k: v for k, v in schema.items() if k != "$schema"}
        return jsonschema.Draft202012Validator(schema).is_valid(value)
    return jsonschema.validators.validator_for(schema)(schema).is_valid(value)


@pytest.mark.parametrize("probe", [p for p in PROBES if PROBES[p][-1] not in ("exact", "siblings")])
def test_auto_lenient_compiles_what_strict_refuses(probe, backends):
    schema, *_ = PROBES[probe]
    compiled = backends["auto"].compile(JsonSchema(schema, strict=False, lenient=True))
    assert compiled.warnings, "a loose grammar must say what it does not enforce"


def test_a_loose_lenient_grammar_is_caught_by_the_end_of_request_check(backends, tok):
    """lenient=True compiles what auto refuses; what the grammar then lets through, validate_output
    refuses: the path the engine takes before finish_reason="stop"."""
    caught = 0
    for probe, (schema, _, invalid, *_rest, auto) in PROBES.items():
        if auto in ("exact", "siblings"):
            continue
        spec = JsonSchema(schema, strict=False, lenient=True)
        matcher = backends["auto"].matcher(backends["auto"].compile(spec))
        for value in invalid:
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
            if matcher.accept(tok.encode(text) + [tok.eos_token_ids[0]]):
                caught += 1
                with pytest.raises(GrammarError):
                    validate_output(spec, text)
            matcher.reset()
    assert caught >= 5, "the lenient grammars should let several invalid probes through"


def test_lenient_is_part_of_the_cache_key():
    assert JsonSchema({"not": {}}).key != JsonSchema({"not": {}}, lenient=True).key


def test_xgrammar_stderr_warnings_are_captured(backends, capfd):
    compiled = backends["xgrammar"].compile(JsonSchema({"type": "number", "multipleOf": 0.5}))
    assert any("multipleOf" in w and "xgrammar:" in w for w in compiled.warnings), compiled.warnings
    assert "multipleOf" not in capfd.readouterr().err


def test_unknown_formats_are_annotations_with_a_warning(backends):
    compiled = backends["llguidance"].compile(JsonSchema({"type": "object", "properties": {
        "format": {"type": "string", "format": "no-such-format"}}}))
    assert any("'no-such-format' at /properties/format" in w for w in compiled.warnings), compiled.warnings
    assert not compiled.inexact


LENIENCY = Path(__file__).parents[2] / "grammars" / "LENIENCY.md"


def test_the_leniency_table_is_this_table():
    """grammars/LENIENCY.md's keyword table states exactly what PROBES asserts."""
    rows = {}
    for line in LENIENCY.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].strip("`") in PROBES:
            rows[cells[0].strip("`")] = tuple(re.match(r"[a-z]*", c).group() for c in cells[1:])
    assert set(rows) == set(PROBES), set(PROBES) ^ set(rows)
    for probe, (xgr, llg, auto) in rows.items():
        expected_auto = PROBES[probe][5] if PROBES[probe][5] in ("exact", "siblings") else "refused"
        assert (xgr, llg, auto) == (*PROBES[probe][3:5], expected_auto), probe


def test_a_keyword_xgrammar_does_not_enforce_is_said_once() -> None:
    (gap,) = gaps({"not": {"type": "string"}}, "xgrammar")
    assert str(gap) == "'not' at /"
