"""CudaTimeline and hostfunc on a GPU: the CPU timeline's semantics, graphs that replay host
callbacks, callables kept alive exactly as long as needed, and no deadlock. Skips without CUDA."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import anyio
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from interlock.streams.errors import TimelineError  # noqa: E402
from interlock.streams.timeline import Timeline  # noqa: E402

SLEEP_CYCLES = 50_000_000  # ~25-50 ms of device time: long enough that a missing wait shows


@pytest.fixture
def timeline() -> Iterator[object]:
    from interlock.streams.cuda_timeline import CudaTimeline

    tl = CudaTimeline()
    yield tl
    tl.close()
    assert tl.host_functions_pending == 0  # nothing kept alive past close


def test_hostfunc_graph_two_increments_replayed_ten_times_leaves_twenty() -> None:
    from interlock.streams.hostfunc import HostFunctions

    host = HostFunctions()
    counter = [0]

    def bump() -> None:
        counter[0] += 1

    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="thread_local")
        keys = [host.launch(stream.cuda_stream, bump, once=False) for _ in range(2)]
        graph.capture_end()
    assert counter[0] == 0  # capture runs nothing
    with torch.cuda.stream(stream):
        for _ in range(10):
            graph.replay()
    stream.synchronize()
    assert counter[0] == 20
    assert host.pending == 2  # still alive: the graph could replay again
    del graph
    host.release(keys)
    assert host.pending == 0


def test_eager_host_functions_run_once_in_order_and_are_freed() -> None:
    from interlock.streams.hostfunc import HostFunctions

    host = HostFunctions()
    seen: list[int] = []
    stream = torch.cuda.Stream()
    for i in range(100):
        host.launch(stream.cuda_stream, seen.append, (i,))
    stream.synchronize()
    assert seen == list(range(100)) and host.pending == 0


async def test_events_order_the_lanes(timeline) -> None:
    with anyio.fail_after(10):
        as_protocol: Timeline = timeline
        assert as_protocol.grammar.name == "grammar" and as_protocol.model.name == "model"
        order: list[str] = []
        source = torch.zeros(1024, device="cuda")
        seen = torch.zeros(1024, device="cuda")
        mask = timeline.new_event()
        timeline.grammar.launch(torch.cuda._sleep, SLEEP_CYCLES)
        timeline.grammar.launch(source.fill_, 1.0)
        timeline.grammar.launch_host(order.append, "mask filled")
        timeline.grammar.record(mask)
        timeline.model.launch_host(order.append, "forward")
        timeline.model.wait(mask)
        timeline.model.launch(seen.copy_, source)
        timeline.model.launch_host(order.append, "apply mask")
        await timeline.model.synchronize()
        assert order == ["forward", "mask filled", "apply mask"]
        assert bool((seen == 1).all())  # the copy waited for the fill on the other stream
        assert mask.query()
        stats = timeline.statistics()
        assert stats.grammar.host_calls == 1 and stats.model.host_calls == 2


async def test_never_recorded_event_does_not_wait(timeline) -> None:
    with anyio.fail_after(10):
        ev = timeline.new_event()
        assert ev.query()
        await ev.wait_async()
        timeline.model.wait(ev)
        await timeline.model.synchronize()


async def test_wait_binds_to_the_generation_latest_when_called(timeline) -> None:
    with anyio.fail_after(10):
        token = timeline.new_event()
        timeline.model.record(token)                      # generation 1: completes at once
        await timeline.model.synchronize()
        timeline.grammar.launch(torch.cuda._sleep, SLEEP_CYCLES)
        timeline.grammar.record(token)                    # generation 2: after the sleep
        assert not token.query()
        await token.wait_async()
        assert token.query()


async def test_reused_events_order_every_step(timeline) -> None:
    with anyio.fail_after(10):
        log: list[str] = []
        mask, token = timeline.new_event(), timeline.new_event()
        for step in range(20):
            timeline.grammar.wait(token)
            timeline.grammar.launch_host(log.append, f"g{step}")
            timeline.grammar.record(mask)
            timeline.model.wait(mask)
            timeline.model.launch_host(log.append, f"m{step}")
            timeline.model.record(token)
        await token.wait_async()
        assert log == [f"{lane}{step}" for step in range(20) for lane in "gm"]


async def test_host_exception_fails_the_timeline_and_surfaces_typed(timeline) -> None:
    with anyio.fail_after(10):
        ran: list[str] = []
        mask = timeline.new_event()

        def broken() -> None:
            raise ValueError("bad mask")

        timeline.grammar.launch_host(broken)
        timeline.grammar.launch_host(ran.append, "after failure")
        timeline.grammar.record(mask)
        timeline.model.wait(mask)
        timeline.model.launch_host(ran.append, "model after failure")
        with pytest.raises(TimelineError) as info:
            await timeline.model.synchronize()
        assert isinstance(info.value.__cause__, ValueError)
        with pytest.raises(TimelineError):
            await mask.wait_async()
        with pytest.raises(TimelineError):
            timeline.grammar.launch_host(ran.append, "rejected")
        assert ran == []


def _step(timeline, state: dict[str, torch.Tensor], log: list[int], mask, token) -> None:
    """A miniature step: the grammar lane fills a host buffer and copies it up; the model lane
    computes, waits for the mask, combines, copies down and delivers through a host function."""
    g, m = timeline.grammar, timeline.model
    g.wait(token)
    g.launch_host(lambda: state["pinned_in"].add_(1))                      # host work, pinned buffer
    g.launch(lambda: state["mask"].copy_(state["pinned_in"], non_blocking=True))
    g.record(mask)
    m.launch(lambda: state["logits"].mul_(2).add_(1))
    m.wait(mask)
    m.launch(lambda: state["out"].copy_(state["logits"] + state["mask"]))
    m.launch(lambda: state["pinned_out"].copy_(state["out"], non_blocking=True))
    m.launch_host(lambda: log.append(int(state["pinned_out"][0])))         # reads host memory only
    m.record(token)


def _fresh_state() -> dict[str, torch.Tensor]:
    return {
        "pinned_in": torch.zeros(4, pin_memory=True), "mask": torch.zeros(4, device="cuda"),
        "logits": torch.ones(4, device="cuda"), "out": torch.zeros(4, device="cuda"),
        "pinned_out": torch.zeros(4, pin_memory=True),
    }


async def test_capture_replay_gives_the_eager_results(timeline) -> None:
    with anyio.fail_after(30):
        eager_log: list[int] = []
        state = _fresh_state()
        mask, token = timeline.new_event(), timeline.new_event()
        for _ in range(5):
            _step(timeline, state, eager_log, mask, token)
        await token.wait_async()

        graph_log: list[int] = []
        gstate = _fresh_state()
        with timeline.capture() as program:
            _step(timeline, gstate, graph_log, mask, token)
        assert graph_log == [] and program.ops == 10
        assert float(gstate["logits"][0]) == 1.0      # nothing ran during capture
        for _ in range(5):
            timeline.replay(program)
        await token.wait_async()
        assert graph_log == eager_log and len(eager_log) == 5
        assert torch.equal(gstate["out"], state["out"])
        kept = timeline.host_functions_pending
        assert kept == 2     # the program's two host callables, alive while it can replay
        program.close()
        assert timeline.host_functions_pending == 0
        with pytest.raises(ValueError):
            timeline.replay(program)


async def test_ten_thousand_replays_while_other_threads_work(timeline) -> None:
    counter = [0]
    stop = threading.Event()
    spins = [0, 0]

    def busy(i: int) -> None:
        # Python work that yields the GIL between pieces, as an event loop does. (A thread that
        # only computes keeps the GIL for the whole switch interval, 5 ms, and every callback
        # waits that long for it: slow, not deadlocked.)
        while not stop.is_set():
            spins[i] += sum(range(200))
            time.sleep(0)

    def bump() -> None:
        counter[0] += 1

    x = torch.zeros(16, device="cuda")
    with timeline.capture() as program:
        timeline.grammar.launch_host(bump)
        timeline.model.launch(x.add_, 1)
        timeline.model.launch_host(bump)
    workers = [threading.Thread(target=busy, args=(i,), daemon=True) for i in range(2)]
    for w in workers:
        w.start()
    done = threading.Event()

    def replay_all() -> None:
        for _ in range(10_000):
            timeline.replay(program)
        timeline.model.stream.synchronize()
        done.set()

    runner = threading.Thread(target=replay_all, daemon=True)
    runner.start()
    finished = done.wait(120)
    stop.set()
    for w in workers:
        w.join(5)
    assert finished, "10,000 replays did not finish: deadlock?"
    assert counter[0] == 20_000 and float(x[0]) == 10_000 and min(spins) > 0


async def test_blocked_callback_finishes_while_another_thread_launches(timeline) -> None:
    entered, release = threading.Event(), threading.Event()
    seen: list[str] = []

    def blocking() -> None:
        entered.set()
        assert release.wait(30)
        seen.append("blocked one")

    timeline.grammar.launch_host(blocking)
    assert entered.wait(30)            # the callback holds the driver's callback thread now

    def launcher() -> None:           # another thread enqueues work meanwhile, then unblocks
        y = torch.ones(8, device="cuda")
        timeline.model.launch(y.mul_, 3)
        timeline.model.launch_host(seen.append, "launched meanwhile")
        release.set()

    t = threading.Thread(target=launcher, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive()
    with anyio.fail_after(30):
        await timeline.grammar.synchronize()
        await timeline.model.synchronize()
    assert sorted(seen) == ["blocked one", "launched meanwhile"]


async def test_dropping_a_program_frees_its_callables(timeline) -> None:
    import gc

    counter = [0]
    with timeline.capture() as program:
        timeline.grammar.launch_host(counter.append, 1)
    timeline.replay(program)
    assert timeline.host_functions_pending == 1
    del program
    gc.collect()                       # the finalizer waits for the last replay, then frees
    assert timeline.host_functions_pending == 0 and counter == [0, 1]
