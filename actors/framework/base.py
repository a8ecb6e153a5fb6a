"""The actor base: one task, one bounded inbox, one receive loop, lifecycle hooks.

Lifecycle (pykka's, in structured-concurrency form):

1. `run()` is the actor's only task. It awaits `on_start()`, then reports started through the
   anyio `task_status` (the runtime starts the next actor only after that), then receives
   messages one at a time and dispatches each by its type to a handler.
2. It ends in one of three ways:
   - `stop()` (or the runtime's cancellation): the loop is cancelled at its next await and
     `on_stop()` runs; messages still in the inbox are dropped.
   - the inbox is closed (`inbox.close()`): buffered messages are handled first, then
     `on_stop()` runs — the graceful way to finish.
   - a handler (or `on_start`) raises: `on_failure(exc)` runs and the exception propagates
     out of `run()`, so the runtime can fail the whole engine.
3. Teardown closes the inbox (senders get `ChannelClosedError`) and fails every reply the
   actor still owes (`ask()` callers get `EngineClosedError`, or `EngineError` after a
   failure), so nothing waits on an actor that is gone. Hooks run shielded from cancellation
   but within `stop_timeout_s`.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, TypeVar

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus

from interlock.protocol.errors import EngineClosedError, EngineError
from interlock.actors.framework.channel import Channel
from interlock.actors.framework.reply import PendingReplies, Reply
from interlock.logs import get_logger

M = TypeVar("M")  # the actor's message type (usually a union of frozen dataclasses)
R = TypeVar("R")

Handler = Callable[[Any], Awaitable[None]]

log = get_logger(__name__)


class Actor(Generic[M]):
    """Base class for every actor. Subclasses implement `handlers()` and optionally the hooks.

    Only the actor's own task touches its state; other tasks talk to it through `send`,
    `send_nowait` and `ask`. An actor runs once: it cannot be restarted after it stopped.
    """

    def __init__(self, name: str, *, inbox_size: int = 64, stop_timeout_s: float = 5.0) -> None:
        if not stop_timeout_s > 0:
            raise ValueError(f"stop_timeout_s must be > 0, got {stop_timeout_s!r}")
        self.name = name
        self.inbox: Channel[M] = Channel(inbox_size)
        self.started = anyio.Event()  # set once on_start() returned
        self.stopped = anyio.Event()  # set once teardown finished (after on_stop / on_failure)
        self.failure: BaseException | None = None
        self._stop_timeout_s = stop_timeout_s
        self._replies = PendingReplies()
        self._handlers: dict[type, Handler] = dict(self.handlers())
        self._scope: anyio.CancelScope | None = None
        self._stop_requested = False
        self._ran = False
        self._start_done = False

    # --- to implement ----------------------------------------------------------------------

    def handlers(self) -> Mapping[type, Handler]:
        """Message class -> bound async method, e.g. `{StepPlan: self.on_plan}`.

        Built once in `__init__`; a message whose class (or a base class) is not listed
        crashes the actor with `TypeError`, since it is a wiring bug.
        """
        return {}

    async def on_start(self) -> None:
        """Runs before the actor reports started (allocate, warm up). Raising fails the start."""

    async def on_stop(self) -> None:
        """Runs after a clean stop (`stop()`, cancellation, a closed inbox) if `on_start` completed."""

    async def on_failure(self, exc: BaseException) -> None:
        """Runs after a handler or `on_start` raised `exc`, before it propagates."""

    # --- used by other tasks -----------------------------------------------------------------

    async def send(self, msg: M) -> None:
        """Put `msg` in the inbox, waiting while it is full. `ChannelClosedError` once stopped."""
        await self.inbox.send(msg)

    def send_nowait(self, msg: M) -> None:
        """Put `msg` in the inbox now; `ChannelFullError` if full, `ChannelClosedError` if stopped."""
        self.inbox.send_nowait(msg)

    async def ask(self, build: Callable[[Reply[R]], M]) -> R:
        """Send `build(reply)` and wait for the handler to answer `reply`; return the answer.

        Raises `EngineClosedError` if the actor stops first, `EngineError` if it fails first.
        Never call it from the actor's own handlers (it would wait on itself).
        """
        reply: Reply[R] = self._replies.new()
        try:
            await self.inbox.send(build(reply))
        except BaseException as exc:
            reply.set_exception(exc)
            raise
        return await reply.wait_result()

    def stop(self) -> None:
        """Ask the actor to stop now (sync, idempotent); await `stopped` to know it has."""
        self._stop_requested = True
        self.inbox.close()
        if self._scope is not None:
            self._scope.cancel()

    # --- the task ----------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The actor's task: start handshake, receive loop, teardown (see the module docstring)."""
        if self._ran:
            raise RuntimeError(f"actor {self.name} already ran; actors are single-use")
        self._ran = True
        failure: BaseException | None = None
        try:
            # on_start is inside the scope too, so stop() cannot be outwaited by a slow start;
            # a start stopped this way never reports started (the runtime sees the start fail).
            with anyio.CancelScope() as self._scope:
                if self._stop_requested:
                    self._scope.cancel()
                await anyio.lowlevel.checkpoint()  # honours a stop() that came before run()
                await self.on_start()
                self._start_done = True
                await anyio.lowlevel.checkpoint()  # ...or one during an on_start with no await
                self.started.set()
                task_status.started()
                async for msg in self.inbox:
                    await self._dispatch(msg)
        except Exception as exc:
            failure = exc
            raise
        finally:
            await self._teardown(failure)

    async def _dispatch(self, msg: M) -> None:
        for cls in type(msg).__mro__:
            handler = self._handlers.get(cls)
            if handler is not None:
                await handler(msg)
                return
        raise TypeError(f"actor {self.name} has no handler for {type(msg).__name__}")

    async def _teardown(self, failure: BaseException | None) -> None:
        self.failure = failure
        dropped = self.inbox.drain_nowait()
        if failure is None:
            self._replies.fail_all(EngineClosedError(f"actor {self.name} stopped before replying"))
        else:
            error = EngineError(f"actor {self.name} failed: {failure!r}")
            error.__cause__ = failure
            self._replies.fail_all(error)
        with anyio.CancelScope(shield=True) as scope:
            scope.deadline = anyio.current_time() + self._stop_timeout_s
            try:
                if failure is None:
                    if self._start_done:
                        await self.on_stop()
                else:
                    await self.on_failure(failure)
            except Exception:
                log.exception("actor_teardown_hook_failed", actor=self.name)
        if scope.cancelled_caught:
            log.warning("actor_teardown_timed_out", actor=self.name, timeout_s=self._stop_timeout_s)
        if dropped:
            log.debug("actor_dropped_messages", actor=self.name, count=len(dropped))
        self.stopped.set()
