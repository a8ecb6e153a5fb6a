"""The runtime: every actor in ONE anyio task group, started in order, stopped in reverse.

Start: each actor is started with `task_group.start`, so actor i+1 starts only after actor i
finished `on_start()`; the runtime is ready when the last one reported started.

Crash: an actor's exception does not tear the task group (and with it the caller's code)
down. The runtime catches it in the actor's supervising task, records it, calls
`on_failure(actor_name, exc)` once (the engine fails every in-flight request with a typed
`EngineError` there and refuses new ones), then stops every other actor. Leaving
`async with runtime:` (or `run()` returning) raises `EngineError` chained to the crash.

Stop: leaving `async with`, `stop()`, or the caller being cancelled stops the actors in
reverse start order, each one's teardown finishing before the next is stopped. Actor
teardowns are bounded (`Actor.stop_timeout_s`), so closing never hangs.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from interlock.actors.framework.base import Actor
from interlock.protocol.errors import EngineError
from interlock.logs import get_logger

FailureCallback = Callable[[str, BaseException], None]

log = get_logger(__name__)


class _ShieldWhenStarted(TaskStatus[None]):
    """Passes the started handshake on, shielding the actor's scope from that moment."""

    def __init__(self, inner: TaskStatus[None], scope: anyio.CancelScope) -> None:
        self._inner = inner
        self._scope = scope

    def started(self, value: None = None) -> None:
        self._scope.shield = True
        self._inner.started(value)


def _ignore_failure(actor_name: str, exc: BaseException) -> None:
    return None


class Runtime:
    """Runs a fixed list of actors as one unit. Single use: enter it (or `run()` it) once.

    `on_failure(actor_name, exc)` is called synchronously, at most once, for the first crash;
    it must not raise or block.
    """

    def __init__(self, actors: Sequence[Actor[Any]], *, on_failure: FailureCallback = _ignore_failure) -> None:
        names = [actor.name for actor in actors]
        if not actors:
            raise ValueError("a runtime needs at least one actor")
        if len(set(names)) != len(names):
            raise ValueError(f"actor names must be unique, got {names}")
        self._actors = tuple(actors)
        self._on_failure = on_failure
        self._tg: TaskGroup | None = None
        self._started: list[Actor[Any]] = []
        self._starting: Actor[Any] | None = None
        self._failure: BaseException | None = None
        self._failed_actor: str | None = None
        self._done = anyio.Event()  # stop() was called or an actor crashed
        self._entered = False
        self.ready = False

    @property
    def failure(self) -> BaseException | None:
        """The first actor crash, if any."""
        return self._failure

    @property
    def failed_actor(self) -> str | None:
        """Name of the actor that crashed first, if any."""
        return self._failed_actor

    def stop(self) -> None:
        """Ask every actor to stop (sync, idempotent); `run()` returns once they have."""
        self.ready = False
        self._done.set()
        self._stop_all_nowait()

    async def wait_done(self) -> None:
        """Wait until `stop()` was called or an actor crashed."""
        await self._done.wait()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start everything, report started, wait for `stop()` or a crash, stop everything.

        For `await task_group.start(runtime.run)`. Raises `EngineError` after a crash.
        """
        async with self:
            task_status.started()
            await self._done.wait()

    async def __aenter__(self) -> Runtime:
        if self._entered:
            raise RuntimeError("a Runtime can be entered only once")
        self._entered = True
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        try:
            for actor in self._actors:
                self._starting = actor
                await tg.start(self._supervise, actor)
                self._started.append(actor)
                self._starting = None
                if self._failure is not None:
                    break  # an earlier actor crashed while this one started
        except Exception as exc:
            self._fail(self._starting, exc)
        except BaseException:
            await self._shutdown()
            await tg.__aexit__(None, None, None)
            raise
        if self._failure is not None:
            await self._shutdown()
            await tg.__aexit__(None, None, None)
            raise self._engine_error()
        self.ready = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.ready = False
        self._done.set()
        await self._shutdown()
        assert self._tg is not None  # __aenter__ succeeded, or we would not be here
        # Body errors are not handed to the task group: it would wrap them in an ExceptionGroup.
        await self._tg.__aexit__(None, None, None)
        if self._failure is not None and exc is None:
            raise self._engine_error()

    async def _supervise(self, actor: Actor[Any], *, task_status: TaskStatus[None]) -> None:
        try:
            # Once started, the actor is shielded from the owner's cancellation: __aexit__ (itself
            # shielded) stops the actors one by one in reverse order, rather than all at once.
            # Not before: anyio's start() cancels a still-starting child and waits for it.
            with anyio.CancelScope() as scope:
                await actor.run(task_status=_ShieldWhenStarted(task_status, scope))
        except Exception as exc:
            if not actor.started.is_set():
                raise  # before the handshake: tg.start() re-raises it in __aenter__
            self._fail(actor, exc)

    def _fail(self, actor: Actor[Any] | None, exc: BaseException) -> None:
        name = actor.name if actor is not None else "?"
        if self._failure is not None:
            log.warning("actor_failed_after_engine_failure", actor=name, error=repr(exc))
            return
        self._failure, self._failed_actor = exc, name
        self.ready = False
        log.error("actor_failed", actor=name, error=repr(exc))
        try:
            self._on_failure(name, exc)
        except Exception:
            log.exception("runtime_failure_callback_failed", actor=name)
        self._done.set()
        self._stop_all_nowait()

    def _stop_all_nowait(self) -> None:
        if self._starting is not None:
            self._starting.stop()
        for actor in reversed(self._started):
            actor.stop()

    async def _shutdown(self) -> None:
        # Shielded: this is the cleanup after a cancellation too. Bounded by each actor's
        # own teardown timeout.
        with anyio.CancelScope(shield=True):
            if self._starting is not None:
                self._starting.stop()  # its task ends on its own; the task group waits for it
            for actor in reversed(self._started):
                actor.stop()
                await actor.stopped.wait()

    def _engine_error(self) -> EngineError:
        error = EngineError(f"actor {self._failed_actor} failed: {self._failure!r}")
        error.__cause__ = self._failure
        return error
