"""Running a request's choices on the engine: open them together (so a bad grammar or prompt is
a proper HTTP error before any byte is streamed), then collect or stream them; and cancelling
all of it when the client goes away.

Every engine generator is closed on every path (finish, error, cancel, disconnect): closing it
is what makes the engine free the choice's slot, KV blocks, matcher and draft state.
"""
from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TypeVar

import anyio
from starlette.types import Receive

from interlock.engine import Engine
from interlock.protocol.errors import InterlockError
from interlock.protocol.sampling import Delta
from interlock.server.errors import APIError, from_interlock
from interlock.server.metrics import ServerMetrics
from interlock.server.translate import EngineCall, Plan

T = TypeVar("T")


class ChoiceRun:
    """One engine request: its generator, and its latencies recorded as deltas arrive."""

    def __init__(self, engine: Engine, call: EngineCall, t0: float, metrics: ServerMetrics) -> None:
        self._gen: AsyncGenerator[Delta, None] = engine.generate(  # type: ignore[assignment]
            call.prompt, grammar=call.grammar, sampling=call.sampling, negative_prompt=call.negative_prompt,
            grammar_backend=call.grammar_backend)
        self._t0, self._last, self._metrics = t0, 0.0, metrics
        self.first: Delta | None = None

    async def next(self) -> Delta | None:
        """The next delta, None at the end. Raises the engine's typed errors."""
        try:
            delta = await self._gen.__anext__()
        except StopAsyncIteration:
            return None
        now = time.perf_counter()
        (self._metrics.itl if self._last else self._metrics.ttft).observe(now - (self._last or self._t0))
        self._last = now
        if delta.stats is not None:
            self._metrics.finished(delta.stats)
        return delta

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._gen.aclose()


async def close_all(runs: list[ChoiceRun]) -> None:
    for run in runs:
        await run.aclose()


async def open_runs(engine: Engine, plan: Plan, t0: float, metrics: ServerMetrics) -> list[ChoiceRun]:
    """Submit every choice and wait for each one's first delta; on any error close them all and
    raise it as an APIError (the first choice's error wins, as it is the one clients see first)."""
    # The engine compiles each grammar while its prompt prefills; a grammar that fails ends the
    # request before its first delta, so it still comes back as a 400 (streams send their headers
    # only after the first delta).
    runs = [ChoiceRun(engine, call, t0, metrics) for call in plan.calls]
    errors: dict[int, InterlockError] = {}

    async def first(i: int) -> None:
        try:
            runs[i].first = await runs[i].next()
        except InterlockError as exc:
            errors[i] = exc

    try:
        async with anyio.create_task_group() as tg:
            for i in range(len(runs)):
                tg.start_soon(first, i)
    except BaseException:
        await close_all(runs)
        raise
    if errors:
        await close_all(runs)
        raise from_interlock(errors[min(errors)], plan.grammar_param, plan.prompt_param)
    return runs


async def collect(run: ChoiceRun) -> list[Delta]:
    """All of a run's deltas (the first one already fetched by open_runs)."""
    out = [run.first] if run.first is not None else []
    try:
        while (delta := await run.next()) is not None:
            out.append(delta)
    finally:
        await run.aclose()
    return out


async def collect_all(runs: list[ChoiceRun], grammar_param: str | None) -> list[list[Delta]]:
    results: list[list[Delta]] = [[] for _ in runs]
    errors: list[InterlockError] = []

    async def one(i: int) -> None:
        try:
            results[i] = await collect(runs[i])
        except InterlockError as exc:
            errors.append(exc)

    try:
        async with anyio.create_task_group() as tg:
            for i in range(len(runs)):
                tg.start_soon(one, i)
    finally:
        await close_all(runs)
    if errors:
        raise from_interlock(errors[0], grammar_param)
    return results


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


class ShuttingDown(Exception):
    """The server's drain deadline passed before the answer was ready."""


Waiter = Callable[[], Awaitable[None]]


async def wait_disconnect(receive: Receive) -> None:
    """Returns when the client has gone (`receive` is the request's ASGI receive, body already read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_stopped(work: Callable[[], Awaitable[T]], disconnect: Waiter, deadline: Waiter) -> T:
    """Run `work`; cancel it (closing its engine requests) when the client disconnects (ClientGone)
    or the shutdown deadline passes (ShuttingDown)."""
    result: list[T] = []
    error: list[BaseException] = []

    async def stop_on(wait: Waiter, exc: BaseException, scope: anyio.CancelScope) -> None:
        await wait()
        error.append(exc)
        scope.cancel()

    async def run(scope: anyio.CancelScope) -> None:
        try:
            result.append(await work())
        except Exception as exc:        # re-raised below as itself, not inside an ExceptionGroup
            error.append(exc)
        scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stop_on, disconnect, ClientGone(), tg.cancel_scope)
        tg.start_soon(stop_on, deadline, ShuttingDown(), tg.cancel_scope)
        tg.start_soon(run, tg.cancel_scope)
    if error:
        raise error[0]
    return result[0]


def check_finished(deltas: list[Delta]) -> tuple[str, Delta]:
    """The text of a finished choice and its last delta (which carries finish_reason and stats)."""
    if not deltas or deltas[-1].finish_reason is None or deltas[-1].stats is None:
        raise APIError(500, "the engine ended a request without a finish reason", code="internal_error")
    return "".join(d.text for d in deltas), deltas[-1]
