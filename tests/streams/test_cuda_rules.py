"""CudaRulesTimeline obeys CUDA's rules where CpuTimeline forgives: each rule of
streams/cuda_rules.py with a planted bug that this timeline catches and CpuTimeline does not."""
from __future__ import annotations

import threading
from collections.abc import Iterator

import anyio
import pytest
import torch

from interlock.streams.cpu_timeline import CpuTimeline
from interlock.streams.cuda_rules import CudaRulesTimeline
from interlock.streams.errors import DeviceFaultError, HostFunctionCallError, HostSyncInCaptureError, TimelineError


@pytest.fixture(params=["rules", "cpu"])
def timeline(request) -> Iterator[CpuTimeline | CudaRulesTimeline]:
    tl = CudaRulesTimeline(trace=True) if request.param == "rules" else CpuTimeline()
    yield tl
    tl.close()


def rules(tl: object) -> bool:
    return isinstance(tl, CudaRulesTimeline)


async def drain(tl) -> None:
    await tl.grammar.synchronize()
    await tl.model.synchronize()


# --- rule 1: device work's Python runs at enqueue; its ops run later, in lane order ------------

async def test_device_work_python_reading_host_state_sees_it_as_of_enqueue(timeline) -> None:
    """Planted bug: device work whose *Python* reads what an earlier host function writes. On CUDA
    the Python has run long before the host function: it reads the stale value."""
    with anyio.fail_after(10):
        state = {"rows": 0}
        seen: list[int] = []
        timeline.model.launch_host(state.__setitem__, "rows", 7)
        timeline.model.launch(lambda: seen.append(state["rows"]))
        await drain(timeline)
        assert seen == ([0] if rules(timeline) else [7])


async def test_tensor_ops_run_in_lane_order_after_the_lanes_waits(timeline) -> None:
    """The kernels of device work run after the waits before it, so they read what the other lane
    wrote behind an event (written by a host function after the launch was enqueued)."""
    with anyio.fail_after(10):
        host = torch.zeros(4)
        out: dict[str, torch.Tensor] = {}
        ready = timeline.new_event()
        gate = threading.Event()
        timeline.grammar.launch_host(gate.wait, 5)
        timeline.grammar.launch_host(host.fill_, 3.0)
        timeline.grammar.record(ready)
        timeline.model.wait(ready)
        timeline.model.launch(lambda: out.__setitem__("y", host * 2))
        gate.set()
        await drain(timeline)
        assert out["y"].tolist() == [6.0] * 4


# --- rule 2: one thread runs every lane's host functions, in ready order -----------------------

async def test_host_functions_of_both_lanes_run_on_one_thread(timeline) -> None:
    """Planted bug: the model lane's host function is made to run while a grammar host function is
    still running (a hand-off through host code instead of an event). With one host thread, as on
    CUDA, it cannot run until the grammar one returns."""
    with anyio.fail_after(10):
        filling, ran = threading.Event(), threading.Event()
        seen: dict[str, object] = {}

        def grammar_fill() -> None:
            filling.set()
            seen["model ran meanwhile"] = ran.wait(2.0)        # a bounded wait: ordering, not timing
            seen["grammar thread"] = threading.current_thread().name

        def model_begin() -> None:
            ran.set()
            seen["model thread"] = threading.current_thread().name

        timeline.grammar.launch_host(grammar_fill)
        # the model's host function becomes ready while the fill runs (launched after it started:
        # which of two lanes reaches its host function first is otherwise a race)
        assert await anyio.to_thread.run_sync(filling.wait, 5.0)
        timeline.model.launch_host(model_begin)
        await drain(timeline)
        if rules(timeline):
            assert seen["model ran meanwhile"] is False
            assert seen["grammar thread"] == seen["model thread"] == "interlock-host-functions"
            assert [c.lane for c in timeline.host_trace()] == ["grammar", "model"]
        else:
            assert seen["model ran meanwhile"] is True


# --- rule 3: capture replays the recorded ops on the same memory, never the Python ------------

async def test_a_replay_runs_the_captured_ops_not_the_python(timeline) -> None:
    """Planted bug: captured device work whose Python reads a per-step host value. A replay runs the
    ops recorded at capture: the value is frozen, as in a CUDA graph."""
    with anyio.fail_after(10):
        out = torch.zeros(3)
        step = {"n": 1}
        with timeline.capture() as program:
            timeline.model.launch(lambda: out.add_(step["n"]))
        for n in (1, 2, 3):
            step["n"] = n
            timeline.replay(program)
            await drain(timeline)
        assert out.tolist() == ([3.0] * 3 if rules(timeline) else [6.0] * 3)


async def test_a_replays_own_joins_are_not_counted_as_the_model_lanes_waits() -> None:
    """A replay joins the lanes at its ends (as a CUDA graph does): the model lane then waits for the
    grammar lane's last host function, which is the timeline's boundary and not a wait of the step.
    `wait_seconds` is a step's exposed grammar time (actors/step/program.py): only the program's own waits
    count. Planted: the program's host function holds the grammar lane for 50 ms."""
    with CudaRulesTimeline() as tl, anyio.fail_after(10):
        gate = threading.Event()
        with tl.capture() as program:
            tl.grammar.launch_host(gate.wait, 5)
        tl.replay(program)
        threading.Timer(0.05, gate.set).start()
        await drain(tl)
        joined = tl.statistics().model
        gate.clear()
        ready = tl.new_event()
        with tl.capture() as program:
            tl.grammar.launch_host(gate.wait, 5)
            tl.grammar.record(ready)
            tl.model.wait(ready)                    # the program's own wait: counted
        tl.replay(program)
        threading.Timer(0.05, gate.set).start()
        await drain(tl)
        waited = tl.statistics().model
    assert (joined.waits_blocked, joined.wait_seconds) == (0, 0.0)
    assert waited.waits_blocked == 1 and waited.wait_seconds > 0


async def test_memory_allocated_in_a_capture_is_reused_by_every_replay() -> None:
    with CudaRulesTimeline() as tl, anyio.fail_after(10):
        source = torch.arange(4.0)
        held: list[torch.Tensor] = []
        with tl.capture() as program:
            tl.model.launch(lambda: held.append(source * 10))      # a temporary of the program (its pool)
        assert held[0].data_ptr() == held[0].data_ptr()
        for value in (1.0, 2.0):
            source.fill_(value)
            tl.replay(program)
            await tl.model.synchronize()
            assert held[0].tolist() == [value * 10] * 4 and len(held) == 1   # same tensor, new data


# --- rule 4: no host syncs in captured device work ---------------------------------------------

@pytest.mark.parametrize("read", ["item", "tolist", "bool", "nonzero", "boolean index"])
async def test_a_host_read_in_captured_work_is_an_error(timeline, read: str) -> None:
    x = torch.arange(5)
    reads = {"item": lambda: x.sum().item(), "tolist": lambda: (x + 1).tolist(), "bool": lambda: bool(x.any()),
             "nonzero": lambda: x.nonzero(), "boolean index": lambda: x[x > 2]}
    if rules(timeline):
        with pytest.raises(HostSyncInCaptureError):
            with timeline.capture():
                timeline.model.launch(reads[read])
    else:
        with timeline.capture() as program:
            timeline.model.launch(reads[read])          # the CPU timeline records it without a word
        assert program.ops == 1


async def test_an_eager_host_read_waits_for_the_lane_and_is_counted() -> None:
    with CudaRulesTimeline() as tl, anyio.fail_after(10):
        gate = threading.Event()
        source = torch.zeros(3)
        seen: list[float] = []
        ready = tl.new_event()
        tl.grammar.launch_host(gate.wait, 5)
        tl.grammar.launch_host(source.fill_, 2.0)
        tl.grammar.record(ready)
        tl.model.wait(ready)
        threading.Timer(0.05, gate.set).start()
        tl.model.launch(lambda: seen.append(float((source + 1).sum())))   # waits for the lane, like a stream sync
        assert seen == [9.0]
        assert tl.statistics().model.host_syncs == 1


# --- rule 5: a device fault stops everything, and nobody is told unless they ask ---------------

async def test_a_device_fault_stops_everything_after_it_and_only_asking_reveals_it(timeline) -> None:
    """Planted bug: a kernel indexes out of range inside guarded device work. On CPU the Python
    raises at once and a guard reports it; on CUDA (and here) the kernel faults later, no host
    function runs after it, and the host learns of it only by asking."""
    with anyio.fail_after(10):
        told: list[BaseException] = []
        after: list[str] = []
        table = torch.arange(4)
        index = torch.tensor([9])

        def guarded() -> None:
            try:
                table.index_select(0, index)
            except BaseException as exc:
                told.append(exc)
                raise

        timeline.model.launch(guarded)
        timeline.model.launch_host(after.append, "model host function")
        timeline.grammar.launch_host(after.append, "grammar host function")
        with pytest.raises(TimelineError) as info:
            await timeline.model.synchronize()
        assert after in ([], ["grammar host function"])      # nothing after the fault on its lane
        if rules(timeline):
            assert told == []                                  # the guard never saw it
            assert isinstance(info.value, DeviceFaultError)
            assert isinstance(timeline.health(), DeviceFaultError)
            with pytest.raises(DeviceFaultError):
                await timeline.grammar.synchronize()
        else:
            assert len(told) == 1 and not isinstance(info.value, DeviceFaultError)


# --- rule 6: a fault poisons every later sync and query ------------------------------------------

async def test_after_a_device_fault_queries_and_a_programs_free_raise_it(timeline) -> None:
    """Planted bug: shutdown code that queries an event or frees a captured program after a fault.
    On CUDA both return the context's sticky error (a graph's free syncs on its last replay first)."""
    with anyio.fail_after(10):
        done = timeline.new_event()
        with timeline.capture() as program:
            timeline.model.launch(lambda: torch.arange(4) * 2)
            timeline.model.record(done)
        timeline.replay(program)
        await timeline.model.synchronize()
        timeline.model.launch(lambda: torch.arange(4).index_select(0, torch.tensor([9])))     # a fault
        with pytest.raises(TimelineError):
            await timeline.model.synchronize()
        if rules(timeline):
            with pytest.raises(DeviceFaultError):
                done.query()
            with pytest.raises(DeviceFaultError):
                program.close()
        else:
            assert done.query() is True
            program.close()
        program.close()                                         # idempotent either way


# --- rule 7: a host function makes no timeline call ------------------------------------------------

@pytest.mark.parametrize("call", ["health", "query", "launch", "record"])
async def test_a_host_function_that_calls_the_timeline_fails_it(timeline, call: str) -> None:
    """Planted bug: a host function that asks the timeline (on CUDA a stream or event query, an
    enqueue: a CUDA call in a host function, which deadlocks or returns a mis-typed error)."""
    with anyio.fail_after(10):
        event = timeline.new_event()
        calls = {"health": timeline.health, "query": event.query,
                 "launch": lambda: timeline.model.launch(lambda: None), "record": lambda: timeline.model.record(event)}
        timeline.grammar.launch_host(calls[call])
        if rules(timeline):
            with pytest.raises(TimelineError) as info:
                await timeline.grammar.synchronize()
            assert isinstance(info.value.__cause__, HostFunctionCallError), info.value
        else:
            await timeline.grammar.synchronize()
