"""The per-request output stream: what `Engine.generate()` hands to the user.

Producer side (the Scheduler actor; plain sync calls, never waits): `try_put(item)` returns
False when the bounded buffer is full (the scheduler then pauses that request instead of
blocking the whole step), `finish()` ends it normally, `fail(exc)` ends it with an error. The
stream calls `on_room()` when the consumer takes an item out of a full buffer, so the scheduler
can un-pause the request.

Consumer side: `async for`, `aclose()` / `async with`. Giving up early calls `on_cancel()`
exactly once (never after the producer finished): `aclose()`, leaving `async with`, being
cancelled while waiting for an item, or dropping `iterate()`'s generator.

How the engine should wrap it: Python does not call anything on a plain async *iterator* when
`async for ...: break` leaves the loop, nor when the consuming task is cancelled inside the loop
body. It does for an async *generator*: once the generator is dropped, asyncio's
async-generator finalizer schedules `aclose()`, which runs its `finally`. So `generate()`
should be an async generator (or return `stream.iterate()`, which is one) whose `finally`
calls `stream.cancel()`. A user who keeps a reference to the generator, or wants the cancel
to happen before the next line runs, wraps it in `contextlib.aclosing(...)`.
"""
from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, Literal, TypeVar

import anyio

from interlock.protocol.errors import ChannelClosedError

T = TypeVar("T")

StreamState = Literal["open", "finished", "failed", "cancelled"]


@dataclass(frozen=True)
class OutputStatistics:
    """A snapshot of one output stream."""

    buffered: int
    capacity: int
    total_put: int
    state: StreamState


def _noop() -> None:
    return None


class OutputStream(Generic[T]):
    """A bounded, single-consumer async iterator of items (deltas) for one request.

    `on_room` and `on_cancel` are called synchronously on the consumer's task; they must not
    raise or block (posting with `send_nowait` is the intended use). A wake-up that cannot be
    posted because the scheduler's inbox is full is lost, so the scheduler should also re-check
    `has_room()` of its paused streams each step.
    """

    def __init__(
        self,
        capacity: int,
        *,
        on_room: Callable[[], None] = _noop,
        on_cancel: Callable[[], None] = _noop,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        self._capacity = capacity
        self._buffer: deque[T] = deque()
        self._on_room = on_room
        self._on_cancel = on_cancel
        self._state: StreamState = "open"
        self._error: BaseException | None = None
        self._readable = anyio.Event()  # set when an item or the end arrives
        self._total_put = 0

    # --- producer ------------------------------------------------------------------------

    def has_room(self) -> bool:
        """True while `try_put` would accept an item."""
        return len(self._buffer) < self._capacity

    def try_put(self, item: T) -> bool:
        """Buffer `item`; False (nothing stored) when full. Never waits.

        After the consumer cancelled, items are dropped and True is returned: the on_cancel
        message is already on its way to the producer. After `finish()`/`fail()` it raises
        `ChannelClosedError`, since that is a producer bug.
        """
        if self._state == "cancelled":
            return True
        if self._state != "open":
            raise ChannelClosedError(f"output stream already {self._state}")
        if not self.has_room():
            return False
        self._buffer.append(item)
        self._total_put += 1
        self._readable.set()
        return True

    def finish(self) -> None:
        """End normally: the consumer gets what is buffered, then iteration stops."""
        if self._state == "open":
            self._state = "finished"
            self._readable.set()

    def fail(self, exc: BaseException) -> None:
        """End with an error: the consumer gets what is buffered, then `exc` is raised."""
        if self._state == "open":
            self._state = "failed"
            self._error = exc
            self._readable.set()

    # --- consumer ------------------------------------------------------------------------

    @property
    def state(self) -> StreamState:
        """"open", "finished", "failed" or "cancelled"."""
        return self._state

    def cancel(self) -> None:
        """The consumer gives up (sync; idempotent). Calls `on_cancel` once if still open."""
        self._buffer.clear()
        if self._state == "open":
            self._state = "cancelled"
            self._readable.set()
            self._on_cancel()

    async def aclose(self) -> None:
        """Async spelling of `cancel()`, so `contextlib.aclosing(stream)` works."""
        self.cancel()

    async def receive(self) -> T:
        """Next item; raises StopAsyncIteration at the end, or the error given to `fail()`.

        Cancelling the task that waits here cancels the stream (calls `on_cancel`).
        """
        while not self._buffer:
            if self._state in ("finished", "cancelled"):
                raise StopAsyncIteration
            if self._state == "failed":
                assert self._error is not None  # fail() always stores it
                raise self._error
            self._readable = anyio.Event()
            try:
                await self._readable.wait()
            except anyio.get_cancelled_exc_class():
                self.cancel()
                raise
        was_full = not self.has_room()
        item = self._buffer.popleft()
        if was_full and self._state == "open":
            self._on_room()
        return item

    def iterate(self) -> AsyncGenerator[T, None]:
        """An async generator over the items that cancels the stream when it is closed early."""
        return _iterate(self)

    def statistics(self) -> OutputStatistics:
        """A frozen snapshot: buffered items, capacity, items put so far, state."""
        return OutputStatistics(len(self._buffer), self._capacity, self._total_put, self._state)

    def __aiter__(self) -> OutputStream[T]:
        return self

    async def __anext__(self) -> T:
        return await self.receive()

    async def __aenter__(self) -> OutputStream[T]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()


async def _iterate(stream: OutputStream[T]) -> AsyncGenerator[T, None]:
    # The finally runs on break (via the asyncgen finalizer or aclosing), on cancellation
    # of the consumer anywhere in its loop body, and on errors; cancel() is a no-op after
    # the producer finished.
    try:
        async for item in stream:
            yield item
    finally:
        stream.cancel()
