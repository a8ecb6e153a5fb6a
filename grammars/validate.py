"""The end-of-request check: does a finished output satisfy the spec it was generated under?

A pure function, independent of any backend, so that a lenient or buggy backend cannot produce an
output that this check passes (grammars/LENIENCY.md lists what each backend lets through).

- JsonSchema: the text parses as one strict JSON document (no raw control characters inside
  strings, no NaN/Infinity, no duplicate keys) and validates with `jsonschema` against the schema
  the backends compiled: the user's schema, with objects closed when the spec is `strict`.
  `format` is not asserted (JSON Schema 2020-12: an annotation by default, see grammars/LENIENCY.md);
  backends may enforce known formats more strictly, never less than this check.
- JsonObject: one strict JSON object.
- Regex: `re.fullmatch` (Python's dialect; the backends' regex dialects agree on the common subset).
- Choice: the text is one of the options.
- Ebnf / Lark: no check here: there is no independent parser for those grammars, so the
  backend's acceptance (EOS allowed only when the grammar accepts) is the only guarantee.
- Reasoning / StructuralTag: each constrained part is checked against its own spec. The exact
  split is token-level (`validate_segments` with `SwitchMatcher.segments()`: where the grammar
  switched); `validate_output` splits the text at the markers' text instead, which agrees (a
  trigger fires wherever free text holds it, on a token boundary: grammars/triggers.py) except
  where a constrained part itself holds its end marker's text (inside a JSON string). It is also
  the check of `native=True` grammars, which have no token-level segments.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import (Choice, Ebnf, GrammarSpec, JsonObject, JsonSchema, Lark,
                                        Reasoning, Regex, StructuralTag)

MAX_SHOWN = 200             # characters of the failing output quoted in the error


def validate_output(spec: GrammarSpec, text: str) -> None:
    """Raise GrammarError (saying why) when `text` does not satisfy `spec`; return None otherwise."""
    if isinstance(spec, JsonSchema):
        _check_schema(spec, parse_json(text))
    elif isinstance(spec, JsonObject):
        if not isinstance(parse_json(text), dict):
            raise GrammarError(f"output is JSON but not an object: {_shown(text)}")
    elif isinstance(spec, Regex):
        if python_regex(spec.pattern).fullmatch(text) is None:
            raise GrammarError(f"output does not match the regex {spec.pattern!r}: {_shown(text)}")
    elif isinstance(spec, Choice):
        if text not in spec.options:
            raise GrammarError(f"output is not one of the {len(spec.options)} choices: {_shown(text)}")
    elif isinstance(spec, Reasoning):
        _check_reasoning(spec, text)
    elif isinstance(spec, StructuralTag):
        _check_tags(spec, text)
    elif not isinstance(spec, (Ebnf, Lark)):
        raise GrammarError(f"unknown grammar spec type {type(spec).__name__}")


def validate_segments(segments: Iterable[Any], decode: Callable[[Sequence[int]], str]) -> None:
    """The check for a switching grammar's output, split where the grammar switched: every
    complete constrained segment (grammars/switch/matcher.py `Segment`) must satisfy its spec."""
    for seg in segments:
        if seg.kind == "constrained" and seg.complete and seg.spec is not None:
            validate_output(seg.spec, decode(seg.ids))


def _check_reasoning(spec: Reasoning, text: str) -> None:
    end = spec.end
    if spec.then is None:
        return
    if end not in text:
        # The marker is not in the text (a special token the caller's decode dropped): the text
        # cannot be split here; the token-level check (validate_segments) is the one that can.
        return
    validate_output(spec.then, text.split(end, 1)[1])


def _check_tags(spec: StructuralTag, text: str) -> None:
    pos, count = 0, 0
    while True:
        found = [(text.find(tag.begin, pos), n) for n, tag in enumerate(spec.tags)]
        found = [(at, n) for at, n in found if at >= 0]
        if not found:
            return
        at, n = min(found)
        tag = spec.tags[n]
        inner_start = at + len(tag.begin)
        close = text.find(tag.end, inner_start)
        if close < 0 and tag.end.strip():
            raise GrammarError(f"tag {tag.begin!r} is never closed with {tag.end!r}: {_shown(text[at:])}")
        if close < 0:        # a whitespace end marker at the very end: callers strip trailing text
            close = len(text)
        validate_output(tag.spec, text[inner_start:close])
        count += 1
        if spec.at_most is not None and count > spec.at_most:
            raise GrammarError(f"output holds more than {spec.at_most} tags: {_shown(text)}")
        pos = close + len(tag.end)


def parse_json(text: str) -> Any:
    """One strict JSON document, or GrammarError saying where it breaks."""
    try:
        return json.loads(text, strict=True, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except (json.JSONDecodeError, _NotJson) as exc:
        raise GrammarError(f"output is not valid JSON ({exc}): {_shown(text)}") from exc
    except RecursionError as exc:
        raise GrammarError("output is not valid JSON: nested too deeply to parse") from exc


def _check_schema(spec: JsonSchema, value: Any) -> None:
    validator = _validator(spec.compiled_schema)
    error = next(iter(validator.iter_errors(value)), None)
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        raise GrammarError(f"output does not validate against the JSON schema at {where}: "
                           f"{error.message[:MAX_SHOWN]} (keyword {error.validator!r})")


class _NotJson(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _NotJson(f"duplicate key {key!r}")
        out[key] = value
    return out


def _validator(schema_text: str) -> Any:
    return schema_validator(json.loads(schema_text))


def schema_validator(schema: Any) -> Any:
    """A jsonschema validator (built per call: once per request, no module-level cache) for the
    schema's own dialect ($schema; 2020-12 when absent). GrammarError, saying where, for a schema
    its dialect's meta-schema refuses (`"type": "objekt"`): grammars/checks.py calls it before
    any backend compiles, since no output could pass this check under such a schema."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/" + "/".join(str(p) for p in exc.absolute_path)
        raise GrammarError(f"the JSON schema is not a valid schema at {where}: {exc.message[:MAX_SHOWN]}") from exc
    return cls(schema)


def python_regex(pattern: str) -> re.Pattern[str]:
    """The pattern as this check reads it; GrammarError when Python cannot compile it. The engine's
    intake calls it too (grammars/checks.py `check_regexes`), so a pattern that no output could pass
    (`ab\\`, which both backends compile) is refused before anything is generated."""
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise GrammarError(f"the regex {pattern!r} does not compile in Python, whose `re` checks every "
                           f"output: {exc}") from exc


def _shown(text: str) -> str:
    return repr(text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "…")
