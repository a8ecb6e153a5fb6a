"""Errors in OpenAI's JSON shape: `{"error": {"message", "type", "param", "code"}}`.

`APIError` is raised anywhere in the server; `from_interlock` maps the engine's typed errors one
to one (bad input for this request -> 400, engine failure -> 500, engine closed -> 503).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from fastapi.responses import JSONResponse

from interlock.protocol.errors import (
    CapacityError, EngineClosedError, EngineError, GrammarError, InterlockError, ModelLoadError,
    PromptTooLongError, RequestError, user_message,
)

# status -> OpenAI's `type` for it
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "service_unavailable"}


class APIError(Exception):
    """One HTTP error answer; `headers` carries e.g. Retry-After."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def unsupported(field: str, why: str = "not supported yet") -> APIError:
    """The one answer for a field the server does not implement: a 400 naming it, never an ignore."""
    return APIError(400, f"`{field}` is {why}", param=field, code="unsupported_field")


def from_interlock(exc: InterlockError, grammar_param: str | None = None, prompt_param: str = "messages") -> APIError:
    """The HTTP error for an engine error (grammar_param / prompt_param: the request fields the
    grammar and the prompt came from)."""
    if isinstance(exc, PromptTooLongError):
        return APIError(400, str(exc), param=prompt_param, code="context_length_exceeded")
    if isinstance(exc, GrammarError):
        return APIError(400, user_message(exc), param=grammar_param, code="invalid_grammar")
    if isinstance(exc, RequestError):       # a parameter error may name its field (`field`)
        return APIError(400, str(exc), param=getattr(exc, "field", None), code="invalid_request")
    if isinstance(exc, CapacityError):
        return APIError(400, str(exc), code="over_capacity")
    if isinstance(exc, ModelLoadError):      # e.g. chat messages to a model without a chat template
        return APIError(400, str(exc), param=prompt_param, code="unsupported_by_model")
    if isinstance(exc, EngineClosedError):
        return APIError(503, str(exc), code="engine_closed")
    if isinstance(exc, EngineError):
        return APIError(500, str(exc), code="engine_failed")
    return APIError(500, f"{type(exc).__name__}: {exc}", code="internal_error")


# A loc part that is a field name or an index; pydantic adds the member it tried for a union
# ("dict[str,any]", "list[TextPart]", "NamedToolChoice", "str"), which names no field.
_FIELD = re.compile(r"[a-z_][a-z0-9_]*")
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none", "list", "dict", "any"})


def body_error(errors: Sequence[Any]) -> APIError:
    """The 400 for a body that pydantic refused: `param` the field's dotted path, the message each
    reason pydantic gave for it (a union field gets one per member it tried)."""
    if not errors:
        return APIError(400, "invalid request body", code="invalid_value")
    first = errors[0]
    if first.get("type") == "json_invalid":     # loc is ("body", byte offset): no field to name
        where = [p for p in first.get("loc", ()) if isinstance(p, int)]
        at = f" at character {where[0]}" if where else ""
        reason = (first.get("ctx") or {}).get("error") or first.get("msg")
        return APIError(400, f"the request body is not valid JSON{at}: {reason}", code="invalid_json")
    param = field_path(first.get("loc", ()))
    reasons = list(dict.fromkeys(e.get("msg", "invalid") for e in errors if field_path(e.get("loc", ())) == param))
    return APIError(400, f"{param or 'body'}: {'; or '.join(reasons)}", param=param, code="invalid_value")


def field_path(loc: Sequence[Any]) -> str | None:
    """The dotted field path of a pydantic error location, up to the first union member's tag."""
    parts: list[str] = []
    for p in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(p, int):
            parts.append(str(p))
        elif isinstance(p, str) and _FIELD.fullmatch(p) and p not in _TYPE_TAGS:
            parts.append(p)
        else:
            break
    return ".".join(parts) or None
