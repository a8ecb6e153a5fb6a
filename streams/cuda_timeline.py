"""The CUDA device timeline: each lane is a CUDA stream, events are CUDA events, host functions
are driver host callbacks (`hostfunc.py`), programs are CUDA graphs.

Semantics are those of `streams/timeline.py`; where CUDA forces a difference it is said here.

- Events: every `record` makes a fresh CUDA event (one *generation*); `wait(event)` and
  `wait_async()` bind to the generation that was latest when they were called, exactly like the
  CPU timeline's counters, so waiting for step i's token event is not delayed by step i+1's
  record of the same event.
- `launch(fn)` calls fn now, on the calling thread, with the lane's stream current. Tensors fn
  allocates belong to that stream (the caching allocator's rule); hand results across lanes
  through persistent buffers and events.
- `launch_host(fn)` is a host callback: it runs on the driver's thread, may be serialized with
  the other lane's callbacks, and must make no CUDA call.
- A host function that raises fails the timeline: later host functions are skipped and every
  call raises `TimelineError`, but kernels already enqueued still run (a stream cannot be
  emptied) and records still complete, so nothing waits forever.
- `synchronize()` and `wait_async()` poll the event from the event loop (20 us, doubling to
  1 ms): the loop never blocks and no thread is parked per waiter.
- Capture: both lanes are captured into one CUDA graph on the model stream, the grammar stream
  forked at the start and joined at the end. An event recorded inside the capture is a private
  graph edge; after each replay the timeline records the user's event again on the model stream,
  so the host sees it complete when the replay ends (its in-graph point is earlier; nothing above
  `streams/` can tell). A wait on an event the program did not record itself is done before the
  graph launch. A replay starts after both lanes' earlier work and later work on either lane
  follows it: programs are joined at their boundaries. A capture that fails still ends: the
  grammar lane's join and `capture_end` both run (`run_all`) and the first error is raised (on an
  invalidated capture the join raises too); the step program then runs that shape eagerly.
- Statistics: `ops_run` counts ops enqueued, `host_calls` the callbacks that ran; a stream's wait
  is not observable from the host (`waits_blocked` / `wait_seconds` stay 0; gpu_bench measures it).
- `close()` waits for both streams (polling, bounded, the GIL free between polls), then frees
  every program's graph and the callables it kept alive; nothing is discarded. After a device
  fault nothing can be freed: a program's free polls its last replay (bounded) and, on a fault
  or a hang, logs and leaks instead of raising the sticky error or waiting forever.
- `health()`: the sticky error (a failed host function, or a device fault read off a stream
  query). Nothing else reports a fault, so the engine's step watchdog polls it.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from interlock.streams.errors import DeviceFaultError, TimelineClosedError, TimelineError
from interlock.streams.hostfunc import HostFunctions
from interlock.streams.timeline import DeviceEvent, HostCall, LaneName, LaneStatistics, TimelineStatistics
from interlock.logs import get_logger

log = get_logger(__name__)

_POLL_FIRST_S = 20e-6
_POLL_MAX_S = 1e-3
_FREE_TIMEOUT_S = 5.0


def run_all(steps: list[Callable[[], object]], error: BaseException | None = None) -> BaseException | None:
    """Run every step even when one raises; return the first error (`error` if given), logging later ones."""
    for step in steps:
        try:
            step()
        except BaseException as exc:  # noqa: BLE001 - the caller raises the first
            if error is None:
                error = exc
            else:
                log.warning("capture_cleanup_failed_after_error", error=repr(exc), first=repr(error))
    return error


class _Shared:
    """Failure / closed state of one timeline, read by host callbacks and callers alike."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.failure: BaseException | None = None
        self.closed = False

    def check(self) -> None:
        if self.failure is not None:
            raise TimelineError(f"a host function failed: {self.failure!r}") from self.failure
        if self.closed:
            raise TimelineClosedError("timeline is closed")

    def fail(self, exc: BaseException) -> None:
        log.error("timeline_host_function_failed", error=repr(exc))
        with self.lock:
            if self.failure is None:
                self.failure = exc


class CudaEvent:
    """A reusable event of one `CudaTimeline` (create it with `timeline.new_event()`)."""

    def __init__(self, timeline: CudaTimeline) -> None:
        self._timeline = timeline
        self._latest: torch.cuda.Event | None = None  # the latest generation recorded

    def query(self) -> bool:
        """True when the latest enqueued record has run (or the event was never recorded)."""
        return self._latest is None or self._latest.query()

    async def wait_async(self) -> None:
        """Wait, without blocking the loop, for the record that was latest when called.

        Raises `TimelineError` if the timeline failed, `TimelineClosedError` if it was closed.
        """
        await _poll(self._latest, self._timeline._shared)

    def _record_on(self, stream: torch.cuda.Stream) -> torch.cuda.Event:
        generation = torch.cuda.Event()
        generation.record(stream)
        self._latest = generation
        return generation


def _query(event_or_stream: torch.cuda.Event | torch.cuda.Stream) -> bool:
    """query(), with the context's sticky error (a device fault) as a typed DeviceFaultError."""
    try:
        return event_or_stream.query()
    except RuntimeError as exc:          # torch raises the CUDA error (illegal address, device assert...)
        raise DeviceFaultError(f"the device faulted: {exc}") from exc


async def _poll(event: torch.cuda.Event | None, shared: _Shared) -> None:
    delay = _POLL_FIRST_S
    while True:
        shared.check()
        if event is None or _query(event):
            shared.check()  # a host function before the event may have failed the timeline
            return
        await asyncio.sleep(delay)
        delay = min(2 * delay, _POLL_MAX_S)


@dataclass
class _ProgramState:
    """What a program keeps alive; freed by `_free` (close or garbage collection)."""

    host: HostFunctions
    graph: torch.cuda.CUDAGraph | None = None
    keys: list[int] = field(default_factory=list)
    done: torch.cuda.Event | None = None  # recorded after each replay

    def free(self, timeout_s: float = _FREE_TIMEOUT_S) -> None:
        # Wait for the last replay by polling (the GIL free between polls: pending callbacks can
        # run), bounded: after a device fault the query raises the sticky error and on a hung stream
        # it never turns true. Either way nothing is freed (a graph a stream may still run, callables
        # the driver may still call): logged and leaked, never raised (this also runs as a finalizer).
        deadline = time.monotonic() + timeout_s
        try:
            while self.done is not None and not _query(self.done):
                if time.monotonic() > deadline:
                    raise TimelineError(f"the last replay did not end within {timeout_s:g} s")
                time.sleep(1e-3)
        except TimelineError as exc:
            log.error("program_not_freed", error=repr(exc))
            return
        if self.graph is not None:
            self.graph.reset()
        self.graph = None
        self.host.release(self.keys)
        self.keys.clear()


class CudaProgram:
    """A captured step: a CUDA graph plus the host callables and events it needs."""

    def __init__(self, host: HostFunctions) -> None:
        self._state = _ProgramState(host)
        self._finalizer = weakref.finalize(self, _ProgramState.free, self._state)
        self._ops = 0
        self.private: dict[CudaEvent, torch.cuda.Event] = {}   # events recorded inside, in order
        self.pre_waits: list[CudaEvent] = []                     # events waited on, recorded outside

    @property
    def ops(self) -> int:
        """Lane ops (host functions, device launches, records, waits) one replay enqueues."""
        return self._ops

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Wait for the last replay, free the graph and the callables it kept alive. Idempotent."""
        self._finalizer()


class CudaLane:
    """One lane: a CUDA stream of the timeline's device (see `timeline.Lane`)."""

    def __init__(self, name: LaneName, timeline: CudaTimeline) -> None:
        self.name: LaneName = name
        self.stream = torch.cuda.Stream(device=timeline.device)
        self._timeline = timeline
        self._ops = 0
        self._host_calls = 0

    def launch_host(self, fn: Callable[..., object], *args: object) -> None:
        """Enqueue `fn(*args)` as a host callback (it must make no CUDA call)."""
        tl = self._timeline
        tl._shared.check()
        program = tl._capturing
        key = tl._host.launch(self.stream.cuda_stream, self._run_host, (fn, args), once=program is None)
        if program is not None:
            program._state.keys.append(key)
        self._count()

    def launch(self, fn: Callable[..., object], *args: object) -> None:
        """Call `fn(*args)` now with this lane's stream current: its kernels run in lane order."""
        self._timeline._shared.check()
        with torch.cuda.stream(self.stream):
            fn(*args)
        self._count()

    def record(self, event: DeviceEvent) -> None:
        """Enqueue the completion of `event`'s next generation (cudaEventRecord)."""
        ev = self._timeline._own(event)
        self._timeline._shared.check()
        program = self._timeline._capturing
        if program is None:
            ev._record_on(self.stream)
        else:
            private = torch.cuda.Event()
            private.record(self.stream)
            program.private.pop(ev, None)   # keep insertion order = order of last record
            program.private[ev] = private
        self._count()

    def wait(self, event: DeviceEvent) -> None:
        """Later ops on this lane wait for `event`'s latest generation (cudaStreamWaitEvent)."""
        ev = self._timeline._own(event)
        self._timeline._shared.check()
        program = self._timeline._capturing
        if program is not None and ev in program.private:
            self.stream.wait_event(program.private[ev])
        elif program is not None:
            program.pre_waits.append(ev)     # recorded outside the program: waited before launch
        elif ev._latest is not None:
            self.stream.wait_event(ev._latest)
        self._count()

    async def synchronize(self) -> None:
        """Wait until everything enqueued so far on this lane ran; raises `TimelineError` if failed."""
        self._timeline._shared.check()
        marker = torch.cuda.Event()
        marker.record(self.stream)
        await _poll(marker, self._timeline._shared)

    def statistics(self) -> LaneStatistics:
        """Counters (see the module docstring for what CUDA can and cannot observe)."""
        with self._timeline._shared.lock:
            return LaneStatistics(self.name, self._ops, self._host_calls, 0, 0.0, False)

    def _run_host(self, fn: Callable[..., object], args: tuple[object, ...]) -> None:
        # The driver's callback thread, GIL held. No CUDA calls in here.
        shared = self._timeline._shared
        if shared.failure is not None or shared.closed:
            return  # sticky error: skip host work (kernels cannot be skipped)
        start = time.perf_counter()
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - fails the timeline, surfaces on every call
            shared.fail(exc)
            return
        trace = self._timeline._trace
        if trace is not None:
            trace.append(HostCall(getattr(fn, "__qualname__", repr(fn)), self.name, threading.current_thread().name,
                                  start, time.perf_counter()))
        with shared.lock:
            self._host_calls += 1

    def _count(self) -> None:
        program = self._timeline._capturing
        if program is not None:
            program._ops += 1
        with self._timeline._shared.lock:
            self._ops += 1


class CudaTimeline:
    """Two `CudaLane`s (grammar, model) on one CUDA device. Use as a context manager or `close()`."""

    def __init__(self, device: torch.device | str | int | None = None, *, trace: bool = False) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("CudaTimeline needs a CUDA device; use CpuTimeline")
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        self._shared = _Shared()
        self._host = HostFunctions(on_error=self._shared.fail)
        self._capturing: CudaProgram | None = None
        self._programs: weakref.WeakSet[CudaProgram] = weakref.WeakSet()
        self._trace: deque[HostCall] | None = deque(maxlen=4096) if trace else None
        self.grammar = CudaLane("grammar", self)
        self.model = CudaLane("model", self)

    @property
    def closed(self) -> bool:
        """True once `close()` was called."""
        return self._shared.closed

    @property
    def host_functions_pending(self) -> int:
        """Host callables kept alive right now (eager ones not yet run + those of live programs)."""
        return self._host.pending

    def new_event(self) -> CudaEvent:
        """A fresh, never-recorded event for either lane of this timeline."""
        return CudaEvent(self)

    def statistics(self) -> TimelineStatistics:
        """Both lanes' counters."""
        return TimelineStatistics(self.grammar.statistics(), self.model.statistics())

    def host_trace(self) -> list[HostCall]:
        """The host functions that ran (with trace=True), oldest first: name, lane, thread, start, end."""
        return list(self._trace or ())

    def health(self) -> BaseException | None:
        """A failed host function, or a device fault (a stream query returns the context's sticky
        error): what the step watchdog asks, since a fault stops the host functions that report."""
        try:
            self._shared.check()
            _query(self.model.stream)
            _query(self.grammar.stream)
        except TimelineError as error:
            return error
        return None

    @contextlib.contextmanager
    def capture(self) -> Iterator[CudaProgram]:
        """Record both lanes' ops inside the block as one CUDA graph (nothing runs).

        Both streams are drained first (GIL released), so no pending callback can wait for the
        GIL while the capture's allocator calls run. Captures do not nest.
        """
        self._shared.check()
        if self._capturing is not None:
            raise RuntimeError("captures do not nest")
        self.model.stream.synchronize()
        self.grammar.stream.synchronize()
        program = CudaProgram(self._host)
        graph = torch.cuda.CUDAGraph()
        self._capturing = program
        ok = False
        try:
            with torch.cuda.stream(self.model.stream):
                graph.capture_begin(capture_error_mode="thread_local")
                error: BaseException | None = None
                try:
                    self.grammar.stream.wait_stream(self.model.stream)    # fork the grammar lane
                    yield program
                except BaseException as exc:  # noqa: BLE001 - kept, raised once the capture has ended
                    error = exc
                # join the grammar lane back, then end the capture, whatever failed: on an
                # invalidated capture the join raises too, and a capture never ended leaves the
                # stream capturing. The first error is the one that says why.
                error = run_all([lambda: self.model.stream.wait_stream(self.grammar.stream), graph.capture_end],
                                error)
                if error is not None:
                    raise error
                ok = True
        finally:
            self._capturing = None
            if not ok:
                program._state.graph = graph
                program.close()
        program._state.graph = graph
        program._state.done = torch.cuda.Event()
        self._programs.add(program)

    def replay(self, program: CudaProgram) -> None:
        """Launch the program's graph once more (see the module docstring for event semantics)."""
        self._shared.check()
        if self._capturing is not None:
            raise RuntimeError("cannot replay inside a capture")
        if not isinstance(program, CudaProgram) or program._state.host is not self._host:
            raise ValueError("program was not captured on this timeline")
        state = program._state
        if state.graph is None or program.closed:
            raise ValueError("program is closed")
        model, grammar = self.model.stream, self.grammar.stream
        model.wait_stream(grammar)                         # after the grammar lane's earlier work
        for ev in program.pre_waits:
            if ev._latest is not None:
                model.wait_event(ev._latest)
        with torch.cuda.stream(model):
            state.graph.replay()
        for ev in program.private:
            ev._record_on(model)
        done = state.done
        assert done is not None                            # the capture made it
        done.record(model)
        grammar.wait_event(done)                           # later grammar work follows the replay
        with self._shared.lock:
            self.model._ops += program.ops

    def close(self, timeout_s: float = 10.0) -> None:
        """Wait for both streams, free every program and its callables (idempotent). After a device
        fault, or streams still busy after `timeout_s` (a hung kernel), nothing can be freed: it
        marks the timeline closed and raises TimelineError."""
        if self._shared.closed:
            return
        deadline = time.monotonic() + timeout_s
        try:
            while not (_query(self.model.stream) and _query(self.grammar.stream)):
                if time.monotonic() > deadline:
                    raise TimelineError(f"the streams did not drain within {timeout_s:g} s")
                time.sleep(1e-3)
        except TimelineError:
            self._shared.closed = True
            raise
        self._shared.closed = True
        for program in list(self._programs):
            program.close()

    def _own(self, event: DeviceEvent) -> CudaEvent:
        if not isinstance(event, CudaEvent) or event._timeline is not self:
            raise ValueError("event does not belong to this timeline (use timeline.new_event())")
        return event

    def __enter__(self) -> CudaTimeline:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
