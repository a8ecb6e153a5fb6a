"""Which JSON Schema keywords each backend enforces exactly: the checker `auto` decides with.

A backend is *exact* on a schema when its grammar accepts every instance `jsonschema` accepts and
refuses every other one. llguidance refuses at compile time what it cannot enforce (one reason
`auto` tries it first); xgrammar 0.2.x compiles almost anything and silently drops what it does not
implement, so for xgrammar exactness is decided here, by an allow-list: a schema is exact for it
only when every assertion keyword, at every subschema, is one xgrammar is known (and tested,
tests/grammars/test_keywords.py) to enforce, in the position where it is enforced. Anything else
is a `Gap`, named by keyword and JSON pointer. grammars/LENIENCY.md has the table in prose.

Terms: a *subschema* is any value in schema position (the root, `properties/x`, `items`, `anyOf/0`,
...); an *annotation* is a keyword with no effect on validity (title, description, ..., unknown
keywords, and `format`, which JSON Schema 2020-12 makes an annotation by default).
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from interlock.protocol.errors import GrammarError, SchemaKeywordError

# Keywords that never change which instances are valid (JSON Schema 2020-12 core/meta-data/content
# vocabularies, plus `format`: format-annotation is the default vocabulary). Unknown keywords
# (OpenAPI's `nullable`, vendor `x-*`) are ignored by the spec, by jsonschema and by both backends.
ANNOTATIONS = frozenset({
    "$schema", "$id", "$anchor", "$dynamicAnchor", "$comment", "$vocabulary", "id",
    "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
    "contentEncoding", "contentMediaType", "contentSchema", "format",
})
CONTAINERS = frozenset({"$defs", "definitions"})     # hold subschemas; validate nothing themselves

# Every assertion/applicator keyword of drafts 4 to 2020-12; a key outside this set is unknown.
ASSERTIONS = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxContains",
    "minContains", "maxProperties", "minProperties", "required", "dependentRequired", "dependencies",
    "properties", "patternProperties", "additionalProperties", "propertyNames", "items", "prefixItems",
    "additionalItems", "contains", "unevaluatedItems", "unevaluatedProperties", "allOf", "anyOf",
    "oneOf", "not", "if", "then", "else", "dependentSchemas", "$ref", "$dynamicRef", "$recursiveRef",
})

# Keywords under which xgrammar 0.2.x drops every sibling assertion (type included).
XGRAMMAR_SIBLING_DROPPERS = ("$ref", "allOf", "anyOf", "oneOf")
# What xgrammar enforces exactly, each under the condition `_xgrammar_condition` checks.
XGRAMMAR_EXACT = frozenset({
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "minLength", "maxLength", "pattern", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minProperties", "maxProperties",
    "$ref", "anyOf", "allOf", "oneOf",
})
# Formats llguidance enforces; it refuses a schema naming any other, so the llguidance backend
# drops those (an annotation by the spec) with a warning. tests/grammars/test_keywords.py checks it.
LLGUIDANCE_FORMATS = frozenset({"date-time", "date", "time", "duration", "email", "hostname", "ipv4",
                                "ipv6", "uuid", "uri"})
OLD_DRAFTS = ("draft-04", "draft-06", "draft-07")     # $ref replaces its siblings there


@dataclass(frozen=True)
class Gap:
    """A keyword at `path` (a JSON pointer) that a backend would not enforce exactly."""

    keyword: str
    path: str
    why: str

    def __str__(self) -> str:
        at = f"'{self.keyword}' at {self.path or '/'}"
        return f"{at} ({self.why})" if self.why else at


def subschemas(schema: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(JSON pointer, subschema) for every object in schema position, root first; no recursion
    through $ref (each definition is visited once, under $defs/definitions)."""
    stack = [(path, schema)]
    while stack:
        where, node = stack.pop()
        if not isinstance(node, dict):
            continue
        yield where, node
        for key, value in node.items():
            here = f"{where}/{_escape(key)}"
            if key in ("properties", "patternProperties", "dependentSchemas", *CONTAINERS) and isinstance(value, dict):
                stack.extend((f"{here}/{_escape(k)}", v) for k, v in value.items())
            elif key == "dependencies" and isinstance(value, dict):
                stack.extend((f"{here}/{_escape(k)}", v) for k, v in value.items() if isinstance(v, dict))
            elif key in ("items", "prefixItems", "allOf", "anyOf", "oneOf") and isinstance(value, list):
                stack.extend((f"{here}/{i}", v) for i, v in enumerate(value))
            elif key in ("items", "additionalItems", "additionalProperties", "contains", "not", "if", "then",
                         "else", "propertyNames", "unevaluatedItems", "unevaluatedProperties"):
                stack.append((here, value))


def gaps(schema: Any, backend: str) -> tuple[Gap, ...]:
    """The keywords of `schema` that `backend` ("xgrammar" or "llguidance") would not enforce
    exactly. llguidance refuses at compile time the keywords it cannot enforce: none are listed
    for it."""
    if backend == "xgrammar":
        ref_replaces = _old_draft(schema)
        return tuple(g for where, node in subschemas(schema) for g in _xgrammar_node(where, node, ref_replaces))
    return ()       # llguidance refuses at compile time what it cannot enforce (but see ref_siblings)


def assertion_keys(node: dict[str, Any]) -> list[str]:
    """The keys of node that can make an instance invalid."""
    return [k for k in node if k in ASSERTIONS]


def _xgrammar_node(where: str, node: dict[str, Any], ref_replaces: bool) -> Iterator[Gap]:
    """ref_replaces: the schema's draft ignores keywords beside $ref, as xgrammar does."""
    if ref_replaces and "$ref" in node:
        return
    keys = assertion_keys(node)
    dropper = next((k for k in XGRAMMAR_SIBLING_DROPPERS if k in node), None)
    for key in keys:
        if dropper is not None and key != dropper:
            yield Gap(key, where, f"xgrammar drops keywords beside '{dropper}'")
        elif key not in XGRAMMAR_EXACT:
            yield Gap(key, where, "")
        else:
            why = _xgrammar_condition(key, node)
            if why:
                yield Gap(key, where, why)


def _xgrammar_condition(key: str, node: dict[str, Any]) -> str:
    """Why xgrammar would not enforce `key` exactly in this node ('' when it does)."""
    value = node[key]
    if key == "pattern" and not _anchored(value):
        return "xgrammar matches patterns as a whole, JSON Schema searches: anchor it with ^...$"
    if key == "multipleOf" and node.get("type") != "integer":
        return "xgrammar enforces multipleOf on integers only"
    if key == "allOf" and isinstance(value, list) and len(value) > 1:
        return "xgrammar keeps one branch of a multi-branch allOf"
    if key == "required" and isinstance(value, list):
        properties = node.get("properties")
        declared = properties if isinstance(properties, dict) else {}
        if any(k not in declared for k in value):
            return "xgrammar does not require keys that 'properties' does not declare"
    if key in ("minLength", "maxLength"):
        return "xgrammar refuses every escape sequence (\\\", \\n, \\u...) in a length-bounded string"
    if key == "items" and isinstance(value, list):
        return "xgrammar does not take the draft-04 array form of 'items'"
    if key in ("exclusiveMinimum", "exclusiveMaximum") and isinstance(value, bool):
        return "xgrammar does not take draft-04 boolean exclusive bounds"
    return ""


def _anchored(pattern: Any) -> bool:
    """^...$ with the final $ not escaped: then a whole-string match equals a search."""
    if not isinstance(pattern, str) or not pattern.startswith("^") or not pattern.endswith("$"):
        return False
    backslashes = len(pattern[:-1]) - len(pattern[:-1].rstrip("\\"))
    return backslashes % 2 == 0


def ref_siblings(schema: Any) -> list[tuple[str, list[str]]]:
    """(JSON pointer, keywords) of each `$ref` with sibling assertions in a draft-07 (or older)
    schema. Those drafts ignore the siblings; llguidance applies them. That is no gap: every
    output still satisfies the `$ref`, so it is valid under the schema's own draft, and the
    siblings are what the schema's author meant. It refuses some instances the draft allows."""
    if not _old_draft(schema):
        return []
    found = [(where, [k for k in assertion_keys(node) if k != "$ref"]) for where, node in subschemas(schema)
             if "$ref" in node]
    return [(where, keys) for where, keys in found if keys]


def _old_draft(schema: Any) -> bool:
    return isinstance(schema, dict) and any(d in str(schema.get("$schema", "")) for d in OLD_DRAFTS)


def keywords_in(text: str) -> set[str]:
    """The JSON Schema keywords a backend's message names ("oneOf with overlapping ...",
    'Unimplemented keys: ["else", "if", "then"]')."""
    words = set(re.findall(r"[$A-Za-z]+", text))
    # "not" is also English ("constraints are not supported"): count it only when quoted.
    if "not" in words and not re.search(r"""["'`]not["'`]""", text):
        words.discard("not")
    return words & ASSERTIONS


def unknown_formats(schema: Any, known: frozenset[str]) -> list[tuple[str, str]]:
    """(JSON pointer, format) for every `format` not in known."""
    return [(where, node["format"]) for where, node in subschemas(schema)
            if isinstance(node.get("format"), str) and node["format"] not in known]


def without_formats(schema: Any, drop: set[str]) -> Any:
    """A copy of schema without the `format` keywords whose JSON pointer is in drop."""
    return _rebuild(schema, "", drop)


def _rebuild(node: Any, where: str, drop: set[str]) -> Any:
    if not isinstance(node, dict):
        return node
    out = {k: v for k, v in node.items() if not (k == "format" and where in drop)}
    # Rebuild only the subschemas below this node, the way `subschemas` walks them.
    for key, value in out.items():
        here = f"{where}/{_escape(key)}"
        if key in ("properties", "patternProperties", "dependentSchemas", "dependencies", *CONTAINERS) \
                and isinstance(value, dict):
            out[key] = {k: _rebuild(v, f"{here}/{_escape(k)}", drop) for k, v in value.items()}
        elif key in ("items", "prefixItems", "allOf", "anyOf", "oneOf") and isinstance(value, list):
            out[key] = [_rebuild(v, f"{here}/{i}", drop) for i, v in enumerate(value)]
        elif key in ("items", "additionalItems", "additionalProperties", "contains", "not", "if", "then",
                     "else", "propertyNames", "unevaluatedItems", "unevaluatedProperties"):
            out[key] = _rebuild(value, here, drop)
    return out


def _escape(key: str) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def gap_named(schema: Any, message: str) -> list[Gap]:
    """The first keyword, in schema order, that a backend's message names, and where it is."""
    named = keywords_in(message)
    for where, node in subschemas(schema):
        for key in node:
            if key in named:
                return [Gap(key, where, message)]
    return []


def said_by(name: str, reason: str) -> str:
    """A backend's reason, prefixed with its name once (backend errors already start with it)."""
    return reason if reason.startswith(f"{name}:") else f"{name}: {reason}"


def no_backend_error(named: list[Gap], reasons: list[str]) -> GrammarError:
    """What `auto` raises when every backend refused: a SchemaKeywordError naming the first keyword
    a refusal named (`named`, in backend order), else a GrammarError with each backend's reason."""
    if named:
        first = named[0]
        return SchemaKeywordError(f"no backend enforces JSON schema keyword '{first.keyword}' at "
                                  f"{first.path or '/'}: " + "; ".join(reasons), keyword=first.keyword, path=first.path)
    return GrammarError("no backend could compile this grammar: " + "; ".join(reasons))
