"""PLACEHOLDER (the req helper's branch): the reliab helper's grammars/validate.py replaces this file
at merge. Contract: check_output(spec, text) -> None, raising GrammarError when a completed output
does not satisfy its spec. Here: JsonSchema / JsonObject are parsed with json.loads and (JsonSchema)
validated with jsonschema against spec.compiled_schema; every other spec passes unchecked."""
from __future__ import annotations

import json

from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import GrammarSpec, JsonObject, JsonSchema


def check_output(spec: GrammarSpec, text: str) -> None:
    """Raise GrammarError if `text` (a request's whole output that ended with "stop") is invalid."""
    if not isinstance(spec, (JsonSchema, JsonObject)):
        return
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise GrammarError(f"the output is not JSON: {exc}") from exc
    if isinstance(spec, JsonObject):
        if not isinstance(value, dict):
            raise GrammarError(f"the output is JSON but not an object: {type(value).__name__}")
        return
    import jsonschema

    try:
        jsonschema.validate(value, json.loads(spec.compiled_schema))
    except jsonschema.ValidationError as exc:
        raise GrammarError(f"the output does not validate against the schema: {exc.message}") from exc
    except jsonschema.SchemaError as exc:
        raise GrammarError(f"the schema itself is invalid: {exc.message}") from exc
