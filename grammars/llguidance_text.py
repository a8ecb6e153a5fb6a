"""A spec as llguidance grammar text, and llguidance's verdict on that text without a tokenizer.

llguidance's core (its Rust extension) imports neither torch nor transformers (~0.06 s), so what
it can say of a grammar's text alone, a CLI can say before anything heavy loads
(grammars/precheck.py); the backend (llguidance_backend.py) compiles the same text against the
tokenizer. Formats llguidance does not know are dropped with a warning: an annotation by default in
JSON Schema 2020-12, as llguidance_backend.py's docstring says.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

import llguidance

from interlock.grammars.keywords import LLGUIDANCE_FORMATS, unknown_formats, without_formats
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import Choice, Ebnf, GrammarSpec, JsonObject, JsonSchema, Lark, Regex

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions     # the stub's TypedDict; not in the extension itself


def grammar_text(spec: GrammarSpec, warnings: list[str]) -> str:
    """The llguidance grammar text for spec (parsing errors surface when the matcher is built, or in
    `refusal`); appends to warnings what it dropped."""
    try:
        if isinstance(spec, JsonSchema):
            schema = _annotations_dropped(json.loads(spec.compiled_schema), warnings)
            return _json_grammar(json.dumps(schema), spec.whitespace == "flexible", spec.lenient)
        if isinstance(spec, JsonObject):
            return _json_grammar(json.dumps({"type": "object"}), spec.whitespace == "flexible")
        if isinstance(spec, Regex):
            return llguidance.LLMatcher.grammar_from_regex(spec.pattern)
        if isinstance(spec, Ebnf):
            if spec.root != "root":
                raise GrammarError(f"llguidance: GBNF start rule must be 'root', got {spec.root!r}")
            return llguidance.grammar_from("gbnf", spec.text)
        if isinstance(spec, Lark):
            return llguidance.LLMatcher.grammar_from_lark(spec.text)
        if isinstance(spec, Choice):
            return llguidance.grammar_from("choice", json.dumps(list(spec.options)))
    except GrammarError:
        raise
    except Exception as exc:
        raise GrammarError(f"llguidance: {first_line(exc)}") from exc
    raise GrammarError(f"llguidance: unsupported spec {type(spec).__name__}")


def refusal(spec: GrammarSpec) -> tuple[str | None, tuple[str, ...]]:
    """(llguidance's reason for refusing spec, or None; its warnings): what compiling it would say,
    read from the grammar text alone (LLMatcher.validate_grammar_with_warnings, no tokenizer)."""
    try:
        text = grammar_text(spec, [])
    except GrammarError as exc:
        return str(exc), ()
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text)
    if failed:
        return f"llguidance: {first_line(messages[0] if messages else 'the grammar does not parse')}", ()
    return None, tuple(f"llguidance: {m}" for m in messages)


def first_line(exc: object) -> str:
    """llguidance's message on one line. Its regex errors span several: a header ending in
    "regex parse error:", the pattern echoed with carets under the fault, then "error: why";
    the header alone would leave out why, so each "error:" line's reason is kept too."""
    lines = (str(exc).strip() or type(exc).__name__).splitlines()
    reasons = [line.strip()[len("error:"):].strip() for line in lines[1:] if line.strip().startswith("error:")]
    return " ".join([lines[0].strip(), *reasons])[:500]


def _json_grammar(schema: str, flexible: bool, lenient: bool = False) -> str:
    # Compact output means llguidance's default separators (",", ":") and no optional whitespace.
    options: JsonCompileOptions = {"whitespace_flexible": flexible}
    if lenient:
        options["lenient"] = True
        options["coerce_one_of"] = True
    return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)


def _annotations_dropped(schema: object, warnings: list[str]) -> object:
    """schema without the formats llguidance does not know; `true` becomes `{}` (llguidance wants
    an object to attach its options to: same meaning)."""
    if schema is True:
        return {}
    unknown = unknown_formats(schema, LLGUIDANCE_FORMATS)
    warnings.extend(f"format {name!r} at {where or '/'} is not one llguidance enforces: kept as an "
                    f"annotation (JSON Schema's default), any string is allowed" for where, name in unknown)
    return without_formats(schema, {where for where, _ in unknown}) if unknown else schema
