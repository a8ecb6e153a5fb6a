"""The step watchdog: a step that never reports back becomes a typed error, never a hang.

On CUDA, a device fault (an illegal address, a device assert) stops every later host function, and
a step tells the event loop it ended only from its last host function: without this, a fault or a
hung kernel would leave every request waiting forever. While a step is in flight the watchdog
asks the timeline for its sticky error every `poll_s` (on CUDA: a stream query, which returns
the context's error), and declares the step overdue after `timeout_s`. Either way it hands a
typed error (DeviceFaultError, TimelineError or StepOverdueError) to `on_error`, and the engine
fails every in-flight request with it and refuses new work. Timers on the loop, no task.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from interlock.logs import get_logger
from interlock.protocol.errors import StepOverdueError

log = get_logger(__name__)


class Checkable(Protocol):
    def health(self) -> BaseException | None: ...


class StepWatchdog:
    """Armed when a step is launched, disarmed when its outcome reaches the loop (module docstring)."""

    def __init__(self, timeline: Checkable, on_error: Callable[[BaseException], None], *, timeout_s: float,
                 poll_s: float) -> None:
        self.timeline = timeline
        self.on_error = on_error
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._step = 0
        self._deadline = 0.0
        self.fired: BaseException | None = None

    def arm(self, step: int) -> None:
        """On the loop: `step` was launched."""
        self._loop = asyncio.get_running_loop()
        self._step, self._deadline = step, time.monotonic() + self.timeout_s
        self._schedule()

    def disarm(self) -> None:
        """On the loop: the step's outcome arrived."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self) -> None:
        assert self._loop is not None
        self._timer = self._loop.call_later(self.poll_s, self._check)

    def _check(self) -> None:
        self._timer = None
        if self.fired is not None:
            return
        error = self.timeline.health()
        if error is None and time.monotonic() >= self._deadline:
            error = StepOverdueError(f"step {self._step} did not report back within {self.timeout_s:g} s "
                                     "(EngineConfig.step_timeout_s): a kernel or host function hung")
        if error is None:
            self._schedule()
            return
        self.fired = error
        log.error("step_watchdog_fired", step=self._step, error=repr(error))
        self.on_error(error)
