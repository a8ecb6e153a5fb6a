"""The CPU engine's timeline: each lane is one worker thread draining a bounded FIFO of ops.

Semantics are those of `streams/timeline.py`; events and failure are streams/cpu_events.py. Here
`launch(fn)` (device work) runs on the lane thread like `launch_host`: on the CPU a tensor op runs
when it is called, so the lane's order is the device order, and each lane runs its own host
functions. That is what the CPU engine wants (its grammar lane overlaps its forward on a second
core), and it forgives what CUDA does not; the device runner's CPU tests therefore run on
streams/cuda_rules.py, which obeys CUDA's rules.

Captured programs: inside `with timeline.capture() as program:` every lane call is appended to
the program (lane, kind, callable or event) instead of being enqueued; nothing runs. `replay()`
makes the same lane calls again, in the recorded host order, so each record and wait gets a
fresh generation exactly as in an eager step.

`close()` cancels rather than drains: ops that have not started are discarded, a running host
function is allowed to finish, waiters wake with `TimelineClosedError`, threads are joined.
To drain first, `await lane.synchronize()` on both lanes before closing.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal

from interlock.logs import get_logger
from interlock.streams.cpu_events import CpuEvent, SharedState
from interlock.streams.errors import LaneFullError, TimelineError
from interlock.streams.timeline import DeviceEvent, LaneName, LaneStatistics, TimelineStatistics

OpKind = Literal["host", "device", "record", "wait", "marker", "stop"]

log = get_logger(__name__)


class CpuLane:
    """One lane: a worker thread running its ops in FIFO order (see `timeline.Lane`).

    Subclasses change how an op runs (`_execute`) and what `launch` enqueues; the queue, events,
    waits, statistics and the thread's lifecycle are this class's.
    """

    def __init__(self, name: LaneName, shared: SharedState, max_ops: int, threads: int | None = None) -> None:
        self.name: LaneName = name
        self.threads = threads
        self._shared = shared
        self._ops: queue.Queue[tuple[OpKind, Callable[[], object]]] = queue.Queue(maxsize=max_ops)
        self._ops_run = 0
        self._host_calls = 0
        self._waits_blocked = 0
        self._wait_seconds = 0.0
        self._blocked = False
        self._thread = threading.Thread(target=self._run, name=f"interlock-{name}-lane", daemon=True)
        self._thread.start()

    def launch_host(self, fn: Callable[..., object], *args: object) -> None:
        """Enqueue `fn(*args)` (cudaLaunchHostFunc). Raises `LaneFullError` when the queue is full."""
        if self._recorded("host", fn, args):
            return
        with self._shared.cond:
            self._shared.check()
            self._put("host", lambda: fn(*args))

    def launch(self, fn: Callable[..., object], *args: object) -> None:
        """Enqueue device work `fn(*args)`; on the CPU it runs on the lane thread, like a host function."""
        if self._recorded("device", fn, args):
            return
        with self._shared.cond:
            self._shared.check()
            self._put("device", lambda: fn(*args))

    def record(self, event: DeviceEvent) -> None:
        """Enqueue the completion of `event`'s next generation (cudaEventRecord)."""
        ev = self._own(event)
        if not self._recorded("record", ev, ()):
            self._record(ev, "record")

    def wait(self, event: DeviceEvent) -> None:
        """Enqueue a wait for `event`'s latest enqueued record (cudaStreamWaitEvent)."""
        self._wait(event, counted=True)

    def _wait(self, event: DeviceEvent, counted: bool) -> None:
        """`wait`; `counted=False` for a timeline's own joins (a replay's boundaries), which are not
        time this lane waited for the other lane's work of the step (`wait_seconds`)."""
        ev = self._own(event)
        if self._recorded("wait", ev, ()):
            return
        with self._shared.cond:
            self._shared.check()
            target = ev._enqueued
            self._put("wait", lambda: self._block_until(ev, target, counted))

    async def synchronize(self) -> None:
        """Wait until everything enqueued so far on this lane ran; raises `TimelineError` if failed."""
        marker = CpuEvent(self._shared)
        self._record(marker, "marker")
        await marker.wait_async()

    def statistics(self) -> LaneStatistics:
        """A frozen snapshot of this lane's counters."""
        with self._shared.cond:
            return LaneStatistics(self.name, self._ops_run, self._host_calls, self._waits_blocked,
                                  self._wait_seconds, self._blocked)

    def _recorded(self, kind: str, target: object, args: tuple[object, ...]) -> bool:
        """During a capture: hand the call to the program instead of enqueueing it."""
        program = self._shared.recording
        if program is None:
            return False
        program.add(self, kind, target, args)  # type: ignore[attr-defined]  # each timeline's program type
        return True

    def _own(self, event: DeviceEvent) -> CpuEvent:
        if not isinstance(event, CpuEvent) or event._shared is not self._shared:
            raise ValueError("event does not belong to this timeline (use timeline.new_event())")
        return event

    def _record(self, event: CpuEvent, kind: OpKind) -> None:
        with self._shared.cond:
            self._shared.check()
            generation = event._enqueued + 1
            self._put(kind, lambda: self._shared.complete(event, generation))
            event._enqueued = generation  # only once the op is really queued

    def _put(self, kind: OpKind, op: Callable[[], object]) -> None:
        try:
            self._ops.put_nowait((kind, op))
        except queue.Full:
            # Blocking here would block the event loop, possibly on ops it has yet to enqueue.
            raise LaneFullError(f"{self.name} lane has {self._ops.maxsize} ops queued") from None

    def _block_until(self, event: CpuEvent, target: int, counted: bool = True) -> None:
        shared = self._shared
        with shared.cond:
            if event._completed >= target:
                return
            start = time.perf_counter()
            self._blocked = True
            shared.cond.wait_for(
                lambda: event._completed >= target or shared.failure is not None or shared.closed
            )
            self._blocked = False
            if counted:
                self._wait_seconds += time.perf_counter() - start
                self._waits_blocked += 1

    def _execute(self, kind: OpKind, op: Callable[[], object]) -> None:
        """Run one op on this thread; an exception fails the timeline (a host function's failure)."""
        try:
            op()
        except BaseException as exc:  # noqa: BLE001 - a lane thread has nobody else to tell
            log.error("timeline_host_function_failed", lane=self.name, error=repr(exc))
            self._shared.break_all(exc)
            return
        if kind in ("host", "device", "record", "wait"):
            with self._shared.cond:
                self._ops_run += 1
                self._host_calls += kind in ("host", "device")

    def _run(self) -> None:
        shared = self._shared
        if self.threads is not None:
            # torch's intra-op threads (OpenMP) are set per calling thread: this lane's ops get
            # `threads`, whatever the thread that built the timeline runs with.
            import torch

            # torch gives a thread its count lazily, from the process-wide one, on the thread's
            # first use: let that happen first, or another lane's setting could win later.
            torch.get_num_threads()
            torch.set_num_threads(self.threads)
        while True:
            kind, op = self._ops.get()
            if kind == "stop" or shared.closed:
                return
            if shared.failure is not None:
                continue  # sticky error: skip everything until close()
            self._execute(kind, op)

    def _stop(self) -> None:
        try:
            self._ops.put_nowait(("stop", lambda: None))
        except queue.Full:
            pass  # the thread is not blocked in get(); it sees `closed` after its current op


@dataclass(frozen=True)
class _Call:
    lane: CpuLane
    kind: str                     # "host" | "device" | "record" | "wait"
    target: object                # the callable, or the event
    args: tuple[object, ...]


@dataclass(eq=False)
class CpuProgram:
    """A captured step program: the lane calls made during `capture()`, in host order."""

    _shared: SharedState
    _calls: list[_Call] = field(default_factory=list)
    closed: bool = False

    @property
    def ops(self) -> int:
        """Lane ops one replay enqueues."""
        return len(self._calls)

    def add(self, lane: CpuLane, kind: str, target: object, args: tuple[object, ...]) -> None:
        if self.closed:
            raise TimelineError("capture into a closed program")
        self._calls.append(_Call(lane, kind, target, args))

    def close(self) -> None:
        """Drop the recorded callables (idempotent); replaying a closed program raises ValueError."""
        self.closed = True
        self._calls.clear()


class CpuTimeline:
    """Two `CpuLane`s (grammar, model) and their events. Use as a context manager or `close()`."""

    def __init__(self, *, max_ops_per_lane: int = 1024, close_timeout_s: float = 5.0,
                 model_threads: int | None = None) -> None:
        _check_config(max_ops_per_lane, close_timeout_s, model_threads)
        self._shared = SharedState()
        self._close_timeout_s = close_timeout_s
        # model_threads: the model lane's intra-op threads (None: both lanes run torch as it is set
        # when they start). Given, the grammar lane runs torch at 1 thread: OpenMP gives every
        # thread that runs a parallel region a pool of its own, and a second pool on a machine
        # this size makes each of the model lane's regions wait for its workers to wake
        # (measured: decode 2x slower than the same threads on one pool; docs/performance.md).
        self.grammar = CpuLane("grammar", self._shared, max_ops_per_lane,
                               threads=None if model_threads is None else 1)
        self.model = CpuLane("model", self._shared, max_ops_per_lane, threads=model_threads)

    @property
    def closed(self) -> bool:
        """True once `close()` was called."""
        return self._shared.closed

    def new_event(self) -> CpuEvent:
        """A fresh, never-recorded event for either lane of this timeline."""
        return CpuEvent(self._shared)

    def health(self) -> BaseException | None:
        """The timeline's sticky error (a failed host function), or None."""
        with self._shared.cond:
            return self._shared.error() if self._shared.failure is not None else None

    @contextmanager
    def capture(self) -> Iterator[CpuProgram]:
        """Record the lane calls made inside the block as a program; nothing runs (see module doc)."""
        shared = self._shared
        with shared.cond:
            shared.check()
            if shared.recording is not None:
                raise RuntimeError("captures do not nest")
            program = CpuProgram(shared)
            shared.recording = program
        try:
            yield program
        except BaseException:
            program.close()
            raise
        finally:
            with shared.cond:
                shared.recording = None

    def replay(self, program: CpuProgram) -> None:
        """Make the program's lane calls again, in their recorded order (fresh event generations)."""
        if not isinstance(program, CpuProgram) or program._shared is not self._shared:
            raise ValueError("program was not captured on this timeline")
        if program.closed:
            raise ValueError("program is closed")
        if self._shared.recording is not None:
            raise RuntimeError("replay inside a capture")
        for call in program._calls:
            lane = call.lane
            if call.kind == "host":
                lane.launch_host(call.target, *call.args)  # type: ignore[arg-type]
            elif call.kind == "device":
                lane.launch(call.target, *call.args)  # type: ignore[arg-type]
            elif call.kind == "record":
                lane.record(call.target)  # type: ignore[arg-type]
            else:
                lane.wait(call.target)  # type: ignore[arg-type]

    def statistics(self) -> TimelineStatistics:
        """Both lanes' counters (model-lane `wait_seconds` is the exposed grammar time)."""
        return TimelineStatistics(self.grammar.statistics(), self.model.statistics())

    def close(self) -> None:
        """Discard ops not yet started, wake every waiter, join both threads (idempotent).

        Raises `TimelineError` if a host function is still running after `close_timeout_s`.
        """
        self._shared.break_all(None)
        join_lanes((self.grammar, self.model), self._close_timeout_s)

    def __enter__(self) -> CpuTimeline:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def join_lanes(lanes: tuple[CpuLane, ...], timeout_s: float) -> None:
    """Stop and join lane threads; raises `TimelineError` for one still running after `timeout_s`."""
    for lane in lanes:
        lane._stop()
    for lane in lanes:
        lane._thread.join(timeout_s)
        if lane._thread.is_alive():
            raise TimelineError(f"{lane.name} lane did not stop within {timeout_s}s")


def _check_config(max_ops: object, close_timeout_s: float, model_threads: object) -> None:
    if isinstance(max_ops, bool) or not isinstance(max_ops, int) or max_ops < 1:
        raise ValueError(f"max_ops_per_lane must be an int >= 1, got {max_ops!r}")
    if model_threads is not None and (isinstance(model_threads, bool) or not isinstance(model_threads, int)
                                      or model_threads < 1):
        raise ValueError(f"model_threads must be None or an int >= 1, got {model_threads!r}")
    if not close_timeout_s > 0:
        raise ValueError(f"close_timeout_s must be > 0, got {close_timeout_s!r}")
