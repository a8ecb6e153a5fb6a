"""Two pure ASGI middlewares: a request-body size limit (413), and counting each completion
request's outcome from what was actually sent (ok only when the response completed)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from interlock.server.errors import APIError
from interlock.server.metrics import ServerMetrics

ASGIApp = Callable[..., Any]
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


class BodyTooLarge(Exception):
    pass


class BodyLimit:
    """413 when Content-Length or the bytes received exceed `limit` (chunked bodies are counted)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        too_large = APIError(413, f"request body over {self.limit} bytes", code="body_too_large")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await too_large.response()(scope, receive, send)
        seen = 0
        started = False

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise BodyTooLarge()
            return message

        async def watched(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLarge:
            if not started:
                await too_large.response()(scope, receive, send)


class Outcomes:
    """Counts requests to the completion endpoints by outcome: ok (response completed), cancelled
    (client gone or shutdown before the end), bad_request (4xx), rejected (429), error (5xx)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        endpoint = ENDPOINTS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if endpoint is None:
            return await self.app(scope, receive, send)
        status, complete = 0, False

        async def watched(message: dict) -> None:
            nonlocal status, complete
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                complete = True
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception:
            status = status or 500      # the outer error middleware answers 500
            raise
        finally:
            self.metrics.requests.labels(endpoint, outcome(status, complete)).inc()


def outcome(status: int, complete: bool) -> str:
    if status == 429:
        return "rejected"
    if status >= 500:
        return "error"
    if 400 <= status < 499:
        return "bad_request"
    return "ok" if status == 200 and complete else "cancelled"
