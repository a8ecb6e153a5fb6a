"""What both CPU timelines share: one guarded state per timeline and its reusable events.

An event is a pair of generation counters: `enqueued` (the latest record put on a lane, in host
order) and `completed` (the latest record that ran). `wait(event)` captures `enqueued` when it is
enqueued and blocks its lane until `completed` reaches it. One `threading.Condition` guards every
counter of a timeline, so a failure or `close()` wakes every waiter at once. asyncio code waits
through a loop future that a lane thread settles with `call_soon_threadsafe` (no polling, no
thread parked per waiter).

A timeline fails in one of two ways, and waiters learn which from the error's type:
- a host function raised (`TimelineError`, chained to what it raised);
- device work faulted (`DeviceFaultError`): on CUDA an illegal address or a device assert, on
  the CUDA-rules timeline (streams/cuda_rules.py) a tensor op that raised when its lane ran it.
"""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Literal

from interlock.streams.errors import DeviceFaultError, HostFunctionCallError, TimelineClosedError, TimelineError

FailureKind = Literal["host", "device"]


@dataclass(eq=False)
class _AsyncWaiter:
    event: CpuEvent
    target: int  # generation of the record awaited
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    # Runs on the waiter's loop; the waiter may have been cancelled in the meantime.
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


class SharedState:
    """State that every lane and event of one timeline shares (guarded by `cond`)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.failure: BaseException | None = None     # what raised first (sticky)
        self.failure_kind: FailureKind = "host"
        self.closed = False
        self.async_waiters: list[_AsyncWaiter] = []
        self.recording: object | None = None          # the program a capture() records into, if any
        # Under CUDA's rules (streams/cuda_rules.py): the thread that runs host functions, which may
        # call nothing of the timeline, and whether a device fault poisons event queries too
        self.host_thread: threading.Thread | None = None
        self.sticky_queries = False

    def error(self) -> TimelineError | None:
        """The typed error every call raises now, if the timeline failed or was closed."""
        if self.failure is not None:
            if self.failure_kind == "device":
                error: TimelineError = DeviceFaultError(f"device work faulted: {self.failure!r}")
            else:
                error = TimelineError(f"a host function failed: {self.failure!r}")
            error.__cause__ = self.failure
            return error
        if self.closed:
            return TimelineClosedError("timeline is closed")
        return None

    def check(self) -> None:
        """Raise the timeline's sticky error, if any. Caller holds `cond`."""
        error = self.error()
        if error is not None:
            raise error

    def check_caller(self, what: str) -> None:
        """Under CUDA's rules: raise HostFunctionCallError when a host function makes this call."""
        if self.host_thread is not None and threading.current_thread() is self.host_thread:
            raise HostFunctionCallError(f"a host function called {what}: CUDA forbids CUDA calls in a host "
                                        "function (post what it found to the event loop instead)")

    def check_fault(self) -> None:
        """Under CUDA's rules: after a device fault every query and sync raises it (the context's
        sticky error), as cudaEventQuery and cudaEventSynchronize do. Caller holds `cond`."""
        if self.sticky_queries and self.failure is not None and self.failure_kind == "device":
            self.check()

    def complete(self, event: CpuEvent, generation: int) -> None:
        """Lane thread: `event`'s record number `generation` ran."""
        with self.cond:
            event._completed = max(event._completed, generation)
            self.cond.notify_all()
            ready = [w for w in self.async_waiters if w.event is event and w.target <= generation]
            for waiter in ready:
                self.async_waiters.remove(waiter)
                self._wake(waiter, None)

    def break_all(self, failure: BaseException | None, kind: FailureKind = "host") -> None:
        """Fail (`failure`) or close (None) the timeline and wake every waiter."""
        with self.cond:
            if failure is not None and self.failure is None:
                self.failure, self.failure_kind = failure, kind
            if failure is None:
                self.closed = True
            self.cond.notify_all()
            waiters, self.async_waiters = self.async_waiters, []
            for waiter in waiters:
                self._wake(waiter, self.error())

    @staticmethod
    def _wake(waiter: _AsyncWaiter, error: BaseException | None) -> None:
        try:
            waiter.loop.call_soon_threadsafe(_settle, waiter.future, error)
        except RuntimeError:
            pass  # that loop is closed: nobody is left to wake


class CpuEvent:
    """A reusable event of one CPU timeline (create it with `timeline.new_event()`)."""

    def __init__(self, shared: SharedState) -> None:
        self._shared = shared
        self._enqueued = 0   # generation of the latest record enqueued, in host order
        self._completed = 0  # generation of the latest record that ran

    def query(self) -> bool:
        """True when the latest enqueued record has run (or the event was never recorded). Under
        CUDA's rules: raises from a host function, and after a device fault."""
        self._shared.check_caller("event.query()")
        with self._shared.cond:
            self._shared.check_fault()
            return self._completed >= self._enqueued

    async def wait_async(self) -> None:
        """Wait, without blocking the loop, for the latest record enqueued before this call.

        Raises `TimelineError` (or `DeviceFaultError`) if the timeline failed, `TimelineClosedError`
        if it was closed.
        """
        loop = asyncio.get_running_loop()
        shared = self._shared
        shared.check_caller("event.wait_async()")
        with shared.cond:
            shared.check()
            if self._completed >= self._enqueued:
                return
            waiter = _AsyncWaiter(self, self._enqueued, loop, loop.create_future())
            shared.async_waiters.append(waiter)
        try:
            await waiter.future
        finally:
            with shared.cond:
                if waiter in shared.async_waiters:
                    shared.async_waiters.remove(waiter)
