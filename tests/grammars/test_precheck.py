"""grammars/precheck.py says, without a tokenizer, only what the engine says with one (its intake's
regex check, then the backend's compile): its error is the engine's, word for word, and "compiles"
means the backend compiles it."""
from __future__ import annotations

import json

import pytest

from interlock.grammars.checks import check_regexes
from interlock.grammars.precheck import precheck
from interlock.protocol.errors import GrammarError, SchemaKeywordError
from interlock.protocol.grammar import Choice, Ebnf, JsonObject, JsonSchema, Lark, Regex


def schema(**s: object) -> JsonSchema:
    return JsonSchema(json.dumps(s))


SPECS = [
    schema(type="string", **{"not": {"const": "a"}}),                         # neither backend: a keyword error
    schema(type="object", properties={"a": {"type": "integer"}}, minProperties=1),   # xgrammar's, not llguidance's
    schema(type="object", properties={"a": {"type": "string", "format": "no-such-format"}}),
    schema(type="array", items={"type": "integer"}, contains={"const": 1}),
    schema(type="string", pattern="^a+$"),
    JsonSchema(json.dumps({"type": "string", "not": {"const": "a"}}), lenient=True),
    JsonObject(), Choice(["red", "green"]),
    Regex("[0-9]{3}"), Regex("a{2,1}"), Regex("(?<=a)b"),
    Ebnf('root ::= "a" | "b"'), Ebnf('root ::= "a" foo'), Ebnf('start ::= "a"'),
    Lark('start: "a" | "b"'), Lark("start: x"),
]


@pytest.mark.parametrize("backend", ["auto", "llguidance", "xgrammar"])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{type(s).__name__}:{s.key[:40]}")
def test_precheck_says_what_compiling_says(spec, backend, tiny_backends) -> None:
    try:
        verdict = precheck(spec, backend)
    except GrammarError as exc:
        with pytest.raises(GrammarError) as compiled:
            check_regexes(spec)                        # the engine's intake, before any compile
            tiny_backends[backend].compile(spec)
        assert type(compiled.value) is type(exc) and str(compiled.value) == str(exc)
        return
    if verdict == "compiles":
        tiny_backends[backend].compile(spec)           # raises if it does not
    else:
        assert verdict == "unknown"


def test_precheck_decides_the_common_cases_without_a_tokenizer() -> None:
    """The cases the CLI meets most are decided here, not left to the slow compile."""
    assert precheck(Choice(["a", "b"]), "auto") == "compiles"
    assert precheck(schema(type="object", properties={"a": {"type": "integer"}}, required=["a"]), "auto") == "compiles"
    with pytest.raises(SchemaKeywordError, match="'not' at /"):
        precheck(SPECS[0], "auto")
    with pytest.raises(GrammarError, match="foo"):
        precheck(Ebnf('root ::= "a" foo'), "llguidance")
    assert precheck(Regex("[0-9]{3}"), "xgrammar") == "unknown"       # only xgrammar's own compile can tell
