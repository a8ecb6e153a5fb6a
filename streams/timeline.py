"""The device timeline interface: two ordered lanes (grammar, model) joined by events.

It mirrors CUDA stream semantics so that the CPU implementation (`cpu_timeline.py`, a worker
thread per lane) and a CUDA one (two CUDA streams, host functions via cudaLaunchHostFunc) are
interchangeable, and code above `streams/` cannot tell them apart:

- Ops are *enqueued* on a lane and run later, in FIFO order on that lane; enqueueing never
  waits for them. Two lanes run concurrently.
- `lane.record(event)` marks the point in the lane's order where the event completes.
- `lane.wait(event)` makes later ops on that lane wait for the event's *most recent record
  enqueued before this wait call* (cudaStreamWaitEvent). Host order matters: enqueue the
  record before the wait. Waiting on an event never recorded does not wait at all.
- Events are reusable: recording one again starts its next generation, so one mask event and
  one token event can serve every step (no reset needed, as with CUDA events).
- A host function that raises fails the whole timeline (CUDA errors are sticky): ops not yet
  run are skipped, every waiter wakes, and `synchronize()`, `wait_async()` and later enqueues
  raise `TimelineError` chained to the original exception.

Two kinds of work go on a lane:
- `launch_host(fn)`: host work (grammar advance, mask fill, reading a step's snapshots). On the
  CPU it runs on the lane's thread; on CUDA it is a `cudaLaunchHostFunc` callback that runs when
  the stream reaches it (and makes no CUDA call).
- `launch(fn)`: device work, i.e. fn issues tensor ops (a forward, a mask apply, sampling). On the
  CPU it also runs on the lane's thread, when the lane reaches it; on CUDA fn is called at once on
  the calling thread with the lane's stream current, so the kernels it issues are enqueued (or
  captured) in lane order. fn must not synchronize with the host (no `.item()`, no
  data-dependent shapes): on CUDA it runs once per *capture*, not once per replay, so it must read
  its inputs from persistent buffers that earlier ops of the program fill.

Captured programs (`timeline.capture()` / `timeline.replay(program)`): inside `with
timeline.capture() as program:`, ops enqueued on either lane are recorded instead of run, in
host order; nothing runs during capture. `replay(program)` enqueues the recorded ops again, as if
the same calls were made now: records and waits get fresh generations at each replay, so a
program's events behave exactly as in an eager step. On CUDA a program is a CUDA graph (the
grammar stream forked from and joined to the model stream inside it, host functions as host
nodes kept alive for as long as the program lives); on the CPU it is the recorded op list. Host
functions in a program take no per-step arguments: they read the step's data from bounded
per-actor queues (snapshots) and persistent buffers, so replay i never sees step i+1's state.
`program.close()` (or dropping the timeline) frees the graph and the callables it keeps alive.
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Literal, Protocol

LaneName = Literal["grammar", "model"]


@dataclass(frozen=True)
class LaneStatistics:
    """Counters for one lane. On the model lane `wait_seconds` is the *exposed grammar time*."""

    name: LaneName
    ops_run: int          # host functions, records and waits that ran (synchronize markers excluded)
    host_calls: int       # host functions that ran
    waits_blocked: int    # waits that found their event not yet recorded and had to block
    wait_seconds: float   # total time this lane spent blocked in wait(event) (a replay's own joins excluded)
    blocked: bool         # blocked in a wait(event) right now (which lane a stuck step waits on)
    host_syncs: int = 0   # device work that read a tensor's value on the host (the CUDA-rules timeline counts them)


@dataclass(frozen=True)
class HostCall:
    """One host function as it ran (a timeline's `host_trace()`, when built with trace=True)."""

    name: str
    lane: LaneName
    thread: str
    start: float        # time.perf_counter()
    end: float


@dataclass(frozen=True)
class TimelineStatistics:
    """Both lanes' counters."""

    grammar: LaneStatistics
    model: LaneStatistics


class DeviceEvent(Protocol):
    """A point in a lane's order (CUDA event semantics; see the module docstring)."""

    def query(self) -> bool:
        """True when the most recent record of this event has run (or it was never recorded)."""
        ...

    async def wait_async(self) -> None:
        """Wait, without blocking the event loop, for the most recent record enqueued so far."""
        ...


class Lane(Protocol):
    """One ordered queue of device work."""

    name: LaneName

    def launch_host(self, fn: Callable[..., object], *args: object) -> None:
        """Enqueue `fn(*args)`; it runs after everything enqueued before it on this lane.

        `fn` must be quick, must not wait on the event loop, and (on CUDA) must make no CUDA
        call. Its return value is ignored; an exception fails the timeline.
        """
        ...

    def launch(self, fn: Callable[..., object], *args: object) -> None:
        """Enqueue device work: `fn(*args)` issues tensor ops for this lane (see the module docstring).

        CPU: runs on the lane's thread in FIFO order, like `launch_host`. CUDA: called now with the
        lane's stream current; its kernels run in lane order. Must not synchronize with the host.
        """
        ...

    def record(self, event: DeviceEvent) -> None:
        """Enqueue: complete `event` once everything before it on this lane has run."""
        ...

    def wait(self, event: DeviceEvent) -> None:
        """Enqueue: later ops on this lane wait for the event's latest record enqueued so far."""
        ...

    async def synchronize(self) -> None:
        """Wait (without blocking the loop) until everything enqueued so far on this lane ran."""
        ...


class Program(Protocol):
    """A captured step program (see the module docstring): replayable, closable."""

    @property
    def ops(self) -> int:
        """How many lane ops (host functions, device launches, records, waits) one replay enqueues."""
        ...

    def close(self) -> None:
        """Free what the program keeps alive (the CUDA graph, its host callables). Idempotent."""
        ...


class Timeline(Protocol):
    """Two lanes and their events; the only device abstraction the actors see."""

    grammar: Lane
    model: Lane

    def capture(self) -> AbstractContextManager[Program]:
        """Record the ops enqueued on both lanes inside the block as a program; nothing runs.

        Captures do not nest. An exception inside the block discards the program.
        """
        ...

    def replay(self, program: Program) -> None:
        """Enqueue `program`'s ops once more, in their recorded host order (fresh event generations)."""
        ...

    def new_event(self) -> DeviceEvent:
        """A fresh, never-recorded event usable on both lanes of this timeline."""
        ...

    def statistics(self) -> TimelineStatistics:
        """A frozen snapshot of both lanes' counters."""
        ...

    def health(self) -> BaseException | None:
        """The timeline's sticky error, if any: a failed host function, or a device fault (on CUDA
        this asks the driver). What the step watchdog polls: nothing else reports a device fault."""
        ...

    def close(self) -> None:
        """Stop the lanes; enqueued ops that have not started are discarded (see implementation)."""
        ...
