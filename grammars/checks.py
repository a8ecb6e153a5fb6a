"""Input checks that run before any backend sees a spec: caps on size and depth, schemas that their
meta-schema refuses, empty choices; and, at a request's intake, regexes that the end-of-request
check could never pass.

The caps bound compile time and memory for hostile or accidental giant schemas; they come from
`GrammarConfig` so a deployment can raise them.
"""
from __future__ import annotations

from typing import Any

from interlock.grammars.validate import python_regex, schema_validator
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import (Choice, Ebnf, GrammarConfig, GrammarSpec, JsonObject, JsonSchema, Lark,
                                        Reasoning, Regex, StructuralTag)


def check_spec(spec: GrammarSpec, config: GrammarConfig) -> None:
    """Raise GrammarError if `spec` is malformed in a backend-independent way or over a cap."""
    if isinstance(spec, JsonSchema):
        _check_schema(spec, config)
    elif isinstance(spec, Choice):
        _check_choice(spec, config)
    elif isinstance(spec, (Regex, Ebnf, Lark)):
        text = spec.pattern if isinstance(spec, Regex) else spec.text
        if not isinstance(text, str) or not text:
            raise GrammarError(f"{type(spec).__name__}: the grammar text is empty")
        _check_size(type(spec).__name__, len(text.encode()), config)
    elif isinstance(spec, StructuralTag):       # a switching grammar compiled whole (native=True)
        for tag in spec.tags:
            check_spec(tag.spec, config)
    elif isinstance(spec, Reasoning):
        if spec.then is not None:
            check_spec(spec.then, config)
    elif not isinstance(spec, JsonObject):
        raise GrammarError(f"unknown grammar spec type {type(spec).__name__}")


def check_regexes(spec: GrammarSpec | None) -> None:
    """GrammarError for a Regex anywhere in `spec` (inside switching grammars too) that the
    end-of-request check cannot compile: the engine's intake calls it before a request is queued.
    Not part of check_spec: a backend used on its own reports its own (richer) regex errors."""
    if isinstance(spec, Regex):
        if not isinstance(spec.pattern, str) or not spec.pattern:
            raise GrammarError("Regex: the grammar text is empty")
        python_regex(spec.pattern)
    elif isinstance(spec, Reasoning):
        check_regexes(spec.then)
    elif isinstance(spec, StructuralTag):
        for tag in spec.tags:
            check_regexes(tag.spec)


def _check_schema(spec: JsonSchema, config: GrammarConfig) -> None:
    _check_size("JSON schema", len(spec.schema.encode()), config)
    schema = spec.schema_dict
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"JSON schema must be an object or a boolean, got {type(schema).__name__}")
    depth = json_depth(schema)
    if depth > config.max_schema_depth:
        raise GrammarError(f"JSON schema nests {depth} levels deep, over the cap of "
                           f"{config.max_schema_depth} (GrammarConfig.max_schema_depth)")
    schema_validator(schema)        # a typo ("type": "objekt") is named as one, not as a keyword no backend has


def _check_choice(spec: Choice, config: GrammarConfig) -> None:
    if not spec.options:
        raise GrammarError("Choice: the list of options is empty")
    bad = [o for o in spec.options if not isinstance(o, str) or not o]
    if bad:
        raise GrammarError(f"Choice: every option must be a non-empty string, got {bad[0]!r}")
    _check_size("Choice", sum(len(o.encode()) for o in spec.options), config)


def _check_size(what: str, n_bytes: int, config: GrammarConfig) -> None:
    if n_bytes > config.max_schema_bytes:
        raise GrammarError(f"{what} is {n_bytes} bytes, over the cap of {config.max_schema_bytes} "
                           f"(GrammarConfig.max_schema_bytes)")


def json_depth(value: Any) -> int:
    """Nesting depth of dicts and lists (a scalar is 0), without recursion (no stack overflow)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
        else:
            continue
        deepest = max(deepest, depth + 1)
    return deepest
