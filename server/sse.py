"""Server-sent events for one request: its choices' chunks as they come, then usage, then `[DONE]`.

A plain ASGI response (not Starlette's StreamingResponse) so that the whole stream lives in one
task group: one producer per choice, one sender, one disconnect watcher. A disconnect cancels
the group, and every engine generator is closed on the way out, which cancels the engine
request at once (slot, KV blocks, matcher and draft state freed).
"""
from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from interlock.protocol.errors import InterlockError
from interlock.protocol.sampling import RequestStats
from interlock.server.errors import APIError, from_interlock
from interlock.server.generation import ChoiceRun, close_all, wait_disconnect
from interlock.server.shaping import ChoiceShaper

Chunk = Callable[[list[Any], Any], bytes]     # (choices, usage or None) -> one `data:` event
DONE = b"data: [DONE]\n\n"


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class SSEResponse(Response):
    """Streams `runs` (already open: each holds its first delta) through their shapers.

    A Response subclass only so that FastAPI passes it through; it sends everything itself.
    """

    def __init__(self, runs: list[ChoiceRun], shapers: list[ChoiceShaper], chunk: Chunk,
                 usage: Callable[[list[RequestStats]], Any] | None, grammar_param: str | None,
                 on_close: Callable[[], None], deadline: Callable[[], Awaitable[None]]) -> None:
        self.runs, self.shapers, self.chunk, self.usage = runs, shapers, chunk, usage
        self.grammar_param, self.on_close, self.deadline = grammar_param, on_close, deadline
        self.cut_off = False            # the drain deadline passed mid-stream
        self.stats: list[RequestStats] = []
        self.status_code, self.background = 200, None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                    (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})
            tx, rx = anyio.create_memory_object_stream[bytes](max_buffer_size=4 * len(self.runs))
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch, wait_disconnect, receive, tg.cancel_scope)
                tg.start_soon(self._watch_deadline, tg.cancel_scope)
                tg.start_soon(self._produce, tx)
                async with rx:
                    async for data in rx:
                        await send({"type": "http.response.body", "body": data, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                tg.cancel_scope.cancel()
            if self.cut_off:            # end the stream properly: the client learns why it stopped
                await close_all(self.runs)
                error = APIError(503, "the server shut down before the request finished", code="shutting_down")
                await send({"type": "http.response.body", "body": event(error.body()) + DONE, "more_body": False})
        finally:
            await close_all(self.runs)
            self.on_close()

    @staticmethod
    async def _watch(wait: Callable, receive: Callable, scope: anyio.CancelScope) -> None:
        await wait(receive)
        scope.cancel()

    async def _watch_deadline(self, scope: anyio.CancelScope) -> None:
        await self.deadline()
        self.cut_off = True
        scope.cancel()

    async def _produce(self, tx: MemoryObjectSendStream[bytes]) -> None:
        errors: list[InterlockError] = []
        async with tx:
            async with anyio.create_task_group() as tg:
                for run, shaper in zip(self.runs, self.shapers):
                    tg.start_soon(self._one, run, shaper, tx, errors, tg.cancel_scope)
            if errors:
                await tx.send(event(from_interlock(errors[0], self.grammar_param).body()))
            elif self.usage is not None:
                await tx.send(self.chunk([], self.usage(self.stats)))
            await tx.send(DONE)

    async def _one(self, run: ChoiceRun, shaper: ChoiceShaper, tx: MemoryObjectSendStream[bytes],
                   errors: list[InterlockError], scope: anyio.CancelScope) -> None:
        try:
            await self._emit(tx, shaper.opening())
            delta = run.first
            while delta is not None:
                await self._emit(tx, shaper.piece(delta.text, delta.logprobs))
                if delta.finish_reason is not None:
                    await self._emit(tx, shaper.closing(delta.finish_reason))
                    if delta.stats is not None:
                        self.stats.append(delta.stats)
                delta = await run.next()
        except InterlockError as exc:          # mid-stream: an error event, then the stream ends
            errors.append(exc)
            scope.cancel()
        finally:
            await run.aclose()

    async def _emit(self, tx: MemoryObjectSendStream[bytes], choices: list[Any]) -> None:
        # One chunk per choice delta: a shaper may return several deltas of its one choice (a
        # tool call's header and its first argument piece, thinking then answer), and OpenAI never
        # sends one index twice in a chunk, so clients that read `chunk.choices[0]` miss the rest.
        for choice in choices:
            await tx.send(self.chunk([choice], None))
