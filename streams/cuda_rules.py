"""A CPU timeline that obeys CUDA's rules: what the device runner's CPU tests run on.

`CpuTimeline` (the CPU engine's) forgives what CUDA does not. This one runs on the CPU with the
semantics of `CudaTimeline`, so that a CPU test that passes predicts the GPU:

1. **Device work's Python runs at enqueue.** `lane.launch(fn)` calls fn now, on the caller's
   thread; the tensor ops it issues are recorded (streams/deferred.py) and run later on the
   lane's thread, in lane order, after the lane's waits. Python that reads per-step host state
   inside fn reads it when the step is enqueued, as on CUDA.
2. **One thread runs every host function.** The driver runs the host functions of all streams
   on one thread, one at a time: here a lane that reaches a host function hands it to the
   timeline's host thread and waits; host functions run in the order they become ready.
3. **Capture replays ops, not Python.** Inside `capture()`, device work's Python runs once and
   its ops, the host functions, records and waits are recorded; memory allocated then stays
   allocated while the program lives (a graph's pool). `replay()` enqueues exactly those ops on
   the same memory and calls the same host functions. Events recorded inside a program are
   private to it (the host sees them complete when the replay ends), a wait on an event the
   program did not record is done before it starts, and a replay is joined to both lanes at its
   boundaries: all as `CudaTimeline` does with a CUDA graph.
4. **No host syncs in captured work.** Reading a tensor's value on the host inside device work
   (`item`, `tolist`, `bool`, a data-dependent output shape) raises `HostSyncInCaptureError`
   during capture; eagerly it waits for the lane (a stream sync) and is counted in
   `statistics().model.host_syncs`.
5. **A fault stops everything.** A deferred op that raises (CUDA: an illegal address, a device
   assert) fails the timeline with `DeviceFaultError`: nothing after it runs, host functions
   included, and waiters get the typed error. Nobody is told otherwise: as on CUDA, the host
   learns of it only by asking (`health()`, an event wait), which is what the engine's
   watchdog does. A host function that raises fails it too (`TimelineError`).
6. **A fault poisons every later sync and query.** After a device fault, as CUDA's sticky error
   does: event queries and waits, lane syncs, enqueues, `health()`'s callers and a program's
   `close()` (CUDA frees a graph after syncing on its last replay) all raise `DeviceFaultError`.
   Shutdown after a fault must therefore free nothing on the device (actors/step/program.py drops its
   programs), or it re-raises the fault out of the engine's exit.
7. **A host function makes no timeline call.** Querying an event, a health check, a sync, an
   enqueue, a capture or a replay from a host function raises `HostFunctionCallError`: CUDA
   forbids CUDA calls in a host function (a deadlock, or an error of the wrong type). What a host
   function finds goes to the event loop, which asks the timeline. (A host function touching a
   device tensor is not caught: on the CPU device and host tensors are the same kind.)

`trace=True` keeps each host function's name, lane, thread, start and end (`host_trace()`), as
`make gpu-check` records them on CUDA, and when each launch's device work ran on its lane
(`device_trace()`: on CUDA only a profiler sees that), so that a benchmark can tell host work that
ran under device work from host work that ran with the "device" idle (benchmarks/overlap_bench.py).
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import cast

import torch

from interlock.logs import get_logger
from interlock.streams.cpu_events import CpuEvent, SharedState
from interlock.streams.cpu_timeline import CpuLane, OpKind, _check_config, join_lanes
from interlock.streams.deferred import DeferredOp, DeferredWork
from interlock.streams.errors import HostSyncInCaptureError, TimelineError
from interlock.streams.timeline import DeviceEvent, HostCall, LaneName, LaneStatistics, TimelineStatistics

log = get_logger(__name__)


@dataclass(eq=False)
class _Pending:
    lane: LaneName
    name: str
    op: Callable[[], None]
    done: bool = False


class HostThread:
    """The one thread that runs every lane's host functions, one at a time, in ready order."""

    def __init__(self, shared: SharedState, trace: bool) -> None:
        self._shared = shared
        self._calls: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self.trace: deque[HostCall] | None = deque(maxlen=4096) if trace else None
        self.thread = threading.Thread(target=self._run, name="interlock-host-functions", daemon=True)
        self.thread.start()

    def call(self, lane: LaneName, name: str, op: Callable[[], None]) -> None:
        """Lane thread: run `op` on the host thread and wait for it (or for the timeline to fail)."""
        shared = self._shared
        pending = _Pending(lane, name, op)
        self._calls.put(pending)
        with shared.cond:
            shared.cond.wait_for(lambda: pending.done or shared.failure is not None or shared.closed)

    def stop(self) -> None:
        self._calls.put(None)

    def _run(self) -> None:
        import torch as _torch

        _torch.set_num_threads(1)       # host work beside the model lane: one OpenMP pool (cpu_timeline.py)
        shared = self._shared
        while (pending := self._calls.get()) is not None:
            if shared.failure is None and not shared.closed:
                start = time.perf_counter()
                try:
                    pending.op()
                except BaseException as exc:  # noqa: BLE001 - the host thread has nobody else to tell
                    log.error("timeline_host_function_failed", lane=pending.lane, function=pending.name,
                              error=repr(exc))
                    shared.break_all(exc, "host")
                if self.trace is not None:
                    self.trace.append(HostCall(pending.name, pending.lane, threading.current_thread().name,
                                               start, time.perf_counter()))
            with shared.cond:
                pending.done = True
                shared.cond.notify_all()


def _name(fn: object) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


class RulesLane(CpuLane):
    """A lane whose device work is deferred and whose host functions run on the host thread."""

    def __init__(self, name: LaneName, shared: SharedState, max_ops: int, host: HostThread,
                 threads: int | None = None) -> None:
        self._host = host
        self._syncs = 0
        self.trace: deque[HostCall] | None = deque(maxlen=4096) if host.trace is not None else None
        super().__init__(name, shared, max_ops, threads)

    def launch_host(self, fn: Callable[..., object], *args: object) -> None:
        """Enqueue `fn(*args)`: when the lane reaches it, the host thread runs it; the lane waits."""
        self._shared.check_caller(f"{self.name}.launch_host()")
        if self._recorded("host", fn, args):
            return
        with self._shared.cond:
            self._shared.check()
            self._put("host", _HostOp(self, fn, args))

    def launch(self, fn: Callable[..., object], *args: object) -> None:
        """Run fn's Python now; its tensor ops run later on this lane (module docstring, rules 1 and 4)."""
        self._shared.check_caller(f"{self.name}.launch()")
        with self._shared.cond:
            self._shared.check()
        work = _LaneWork(self, self._shared.recording, _name(fn))
        with DeferredWork(work):
            fn(*args)
        work.flush(last=True)

    def record(self, event: DeviceEvent) -> None:
        self._shared.check_caller(f"{self.name}.record()")
        super().record(event)

    def wait(self, event: DeviceEvent) -> None:
        self._shared.check_caller(f"{self.name}.wait()")
        super().wait(event)

    async def synchronize(self) -> None:
        self._shared.check_caller(f"{self.name}.synchronize()")
        await super().synchronize()

    def statistics(self) -> LaneStatistics:
        s = super().statistics()
        return LaneStatistics(s.name, s.ops_run, s.host_calls, s.waits_blocked, s.wait_seconds, s.blocked,
                              self._syncs)

    def _enqueue_ops(self, ops: list[DeferredOp], name: str) -> None:
        with self._shared.cond:
            self._shared.check()
            self._put("device", _DeviceOps(ops, name))

    def _execute(self, kind: OpKind, op: Callable[[], object]) -> None:
        if kind == "host":
            assert isinstance(op, _HostOp)
            self._host.call(self.name, op.name, op)
            with self._shared.cond:
                self._ops_run += 1
                self._host_calls += 1
            return
        if kind != "device":
            super()._execute(kind, op)
            return
        start = time.perf_counter()
        try:
            with torch.inference_mode():
                op()
        except BaseException as exc:  # noqa: BLE001 - a device fault: nothing after it runs
            log.error("timeline_device_fault", lane=self.name, error=repr(exc))
            self._shared.break_all(exc, "device")
            return
        if self.trace is not None:
            assert isinstance(op, _DeviceOps)
            self.trace.append(HostCall(op.name, self.name, threading.current_thread().name, start,
                                       time.perf_counter()))
        with self._shared.cond:
            self._ops_run += 1

    def _wait_for_lane(self) -> None:
        """Block the calling thread until every op enqueued so far on this lane ran (a stream sync)."""
        marker = CpuEvent(self._shared)
        self._record(marker, "marker")
        shared = self._shared
        with shared.cond:
            shared.cond.wait_for(lambda: marker._completed >= 1 or shared.failure is not None or shared.closed)
            shared.check()


@dataclass(eq=False)
class _HostOp:
    lane: RulesLane
    fn: Callable[..., object]
    args: tuple[object, ...]

    @property
    def name(self) -> str:
        return _name(self.fn)

    def __call__(self) -> None:
        self.fn(*self.args)


@dataclass(eq=False)
class _DeviceOps:
    ops: list[DeferredOp]
    name: str                       # the launch's qualname (`device_trace()`)

    def __call__(self) -> None:
        for op in self.ops:
            try:
                op()
            except BaseException as exc:
                raise RuntimeError(f"{op!r} raised {exc!r}") from exc


class _LaneWork:
    """The sink of one `launch`: batches its deferred ops for the lane, or for the program."""

    def __init__(self, lane: RulesLane, program: object | None, name: str) -> None:
        self.lane, self.program, self.name = lane, program, name
        self.ops: list[DeferredOp] = []

    def emit(self, op: DeferredOp) -> None:
        self.ops.append(op)

    def sync(self, what: str) -> None:
        if self.program is not None:
            raise HostSyncInCaptureError(f"{self.name} read device data on the host during capture: {what}")
        self.flush()
        self.lane._wait_for_lane()
        with self.lane._shared.cond:
            self.lane._syncs += 1

    def flush(self, last: bool = False) -> None:
        """Hand the ops issued so far over. A program keeps an entry for every launch, even one that
        issued nothing: its place in the lane's order is part of the program's dependencies."""
        ops, self.ops = self.ops, []
        if not ops and not (last and self.program is not None):
            return
        if self.program is not None:
            self.program.add_device(self.lane, self.name, ops)  # type: ignore[attr-defined]
        else:
            self.lane._enqueue_ops(ops, self.name)


@dataclass(frozen=True)
class Entry:
    """One recorded lane call of a program, in host order (`RulesProgram.entries`)."""

    lane: RulesLane
    kind: str                       # "host" | "device" | "record" | "wait"
    name: str                       # the host function's or device work's qualname; the event's id
    target: object                  # (fn, args) | list of deferred ops | the event
    private: bool = False           # a wait on an event recorded earlier in this program


@dataclass(eq=False)
class RulesProgram:
    """A captured step (module docstring, rule 3)."""

    _shared: SharedState
    entries: list[Entry] = field(default_factory=list)
    private: dict[CpuEvent, CpuEvent] = field(default_factory=dict)   # user event -> its in-program stand-in
    pre_waits: list[CpuEvent] = field(default_factory=list)
    closed: bool = False

    @property
    def ops(self) -> int:
        return len(self.entries)

    def add(self, lane: RulesLane, kind: str, target: object, args: tuple[object, ...]) -> None:
        if self.closed:
            raise TimelineError("capture into a closed program")
        if kind == "host":
            self.entries.append(Entry(lane, kind, _name(target), (target, args)))
        elif kind == "record":
            assert isinstance(target, CpuEvent)
            self.private.setdefault(target, CpuEvent(self._shared))
            self.entries.append(Entry(lane, kind, f"event-{id(target):x}", target))
        elif kind == "wait":
            assert isinstance(target, CpuEvent)
            inside = target in self.private
            if not inside:
                self.pre_waits.append(target)
            self.entries.append(Entry(lane, kind, f"event-{id(target):x}", target, inside))
        else:
            raise TypeError(f"unexpected {kind} call during capture")

    def add_device(self, lane: RulesLane, name: str, ops: list[DeferredOp]) -> None:
        self.entries.append(Entry(lane, "device", name, ops))

    def close(self) -> None:
        """Free the recorded ops and the memory they hold (idempotent). As CUDA's graph free, which
        syncs on the last replay first: after a device fault it raises the fault (rule 6)."""
        if self.closed:
            return
        self.closed = True
        self.entries.clear()
        self.private.clear()
        with self._shared.cond:
            self._shared.check_fault()


class CudaRulesTimeline:
    """Two `RulesLane`s and one host thread (module docstring). Use as a context manager or `close()`."""

    def __init__(self, *, max_ops_per_lane: int = 4096, close_timeout_s: float = 5.0,
                 model_threads: int | None = None, trace: bool = False) -> None:
        _check_config(max_ops_per_lane, close_timeout_s, model_threads)
        self._shared = SharedState()
        self._close_timeout_s = close_timeout_s
        self._host = HostThread(self._shared, trace)
        self._shared.host_thread, self._shared.sticky_queries = self._host.thread, True     # rules 6 and 7
        self.grammar = RulesLane("grammar", self._shared, max_ops_per_lane, self._host,
                                 threads=None if model_threads is None else 1)
        self.model = RulesLane("model", self._shared, max_ops_per_lane, self._host, threads=model_threads)
        self._joins = (CpuEvent(self._shared), CpuEvent(self._shared))

    @property
    def closed(self) -> bool:
        return self._shared.closed

    def new_event(self) -> CpuEvent:
        """A fresh, never-recorded event for either lane of this timeline."""
        return CpuEvent(self._shared)

    def health(self) -> BaseException | None:
        """The sticky error (a device fault or a failed host function), or None: what a watchdog asks.
        Not from a host function (rule 7: on CUDA this is a stream query)."""
        self._shared.check_caller("timeline.health()")
        with self._shared.cond:
            return self._shared.error() if self._shared.failure is not None else None

    def host_trace(self) -> list[HostCall]:
        """The host functions that ran (with `trace=True`), oldest first."""
        return list(self._host.trace or ())

    def device_trace(self) -> list[HostCall]:
        """Each launch's device work as it ran on its lane (with `trace=True`), oldest first per lane."""
        return [c for lane in (self.grammar, self.model) for c in (lane.trace or ())]

    @contextmanager
    def capture(self) -> Iterator[RulesProgram]:
        """Record both lanes' calls as a program: device work's Python runs, nothing executes."""
        shared = self._shared
        shared.check_caller("timeline.capture()")
        with shared.cond:
            shared.check()
            if shared.recording is not None:
                raise RuntimeError("captures do not nest")
            program = RulesProgram(shared)
            shared.recording = program
        try:
            yield program
        except BaseException:
            program.close()
            raise
        finally:
            with shared.cond:
                shared.recording = None

    def replay(self, program: RulesProgram) -> None:
        """Enqueue the program's ops once more, joined to both lanes at its ends (module docstring)."""
        if not isinstance(program, RulesProgram) or program._shared is not self._shared:
            raise ValueError("program was not captured on this timeline")
        if program.closed:
            raise ValueError("program is closed")
        self._shared.check_caller("timeline.replay()")
        if self._shared.recording is not None:
            raise RuntimeError("cannot replay inside a capture")
        g, m = self.grammar, self.model
        self._join(m, g)                          # after the grammar lane's earlier work
        for event in program.pre_waits:
            m.wait(event)
        self._join(g, m)                          # the grammar lane forks from the model lane
        for e in program.entries:
            if e.kind == "host":
                fn, args = cast("tuple[Callable[..., object], tuple[object, ...]]", e.target)
                e.lane.launch_host(fn, *args)
            elif e.kind == "device":
                e.lane._enqueue_ops(e.target, e.name)  # type: ignore[arg-type]
            elif e.kind == "record":
                e.lane.record(program.private[e.target])  # type: ignore[index]
            elif e.private:
                e.lane.wait(program.private[e.target])  # type: ignore[index]
        self._join(m, g)                          # and joins it back at the end
        for event in program.private:
            m.record(event)                       # the host sees the program's events at its end
        self._join(g, m)                          # later grammar work follows the replay

    def statistics(self) -> TimelineStatistics:
        return TimelineStatistics(self.grammar.statistics(), self.model.statistics())

    def close(self) -> None:
        """Discard ops not yet started, wake every waiter, join the threads (idempotent)."""
        self._shared.break_all(None)
        self._host.stop()
        join_lanes((self.grammar, self.model), self._close_timeout_s)
        self._host.thread.join(self._close_timeout_s)
        if self._host.thread.is_alive():
            raise TimelineError(f"the host-function thread did not stop within {self._close_timeout_s}s")

    def _join(self, waiter: RulesLane, on: RulesLane) -> None:
        event = self._joins[0] if on is self.grammar else self._joins[1]
        on.record(event)
        waiter._wait(event, counted=False)     # the program's boundary, not a wait of its own

    def __enter__(self) -> CudaRulesTimeline:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
