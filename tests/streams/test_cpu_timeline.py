"""The CPU timelines (CpuTimeline, and CudaRulesTimeline where the semantics are shared): FIFO
lanes, CUDA-style record/wait across lanes, sticky errors, clean close. What only CudaRulesTimeline
does (CUDA's rules) is tests/streams/test_cuda_rules.py."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import anyio
import pytest

from interlock.streams.cpu_timeline import CpuTimeline
from interlock.streams.cuda_rules import CudaRulesTimeline
from interlock.streams.errors import LaneFullError, TimelineClosedError, TimelineError
from interlock.streams.timeline import Timeline


def lane_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("interlock-")
            and (t.name.endswith("-lane") or t.name.endswith("host-functions"))]


@pytest.fixture(params=[CpuTimeline, CudaRulesTimeline])
def timeline(request) -> Iterator[CpuTimeline]:
    tl = request.param()
    yield tl
    tl.close()
    assert lane_threads() == []  # no thread outlives its timeline


@pytest.fixture
def cpu_timeline() -> Iterator[CpuTimeline]:
    tl = CpuTimeline()
    yield tl
    tl.close()
    assert lane_threads() == []


async def wait_until(predicate: Callable[[], bool]) -> None:
    # Polls a *state* (never a duration), under the caller's fail_after.
    while not predicate():
        await anyio.sleep(0.001)


def test_cpu_timeline_satisfies_the_interface(timeline: CpuTimeline) -> None:
    as_protocol: Timeline = timeline
    assert as_protocol.grammar.name == "grammar" and as_protocol.model.name == "model"
    assert len(lane_threads()) == (2 if isinstance(timeline, CpuTimeline) else 3)


@pytest.mark.parametrize("cls", [CpuTimeline, CudaRulesTimeline])
def test_bad_config(cls) -> None:
    with pytest.raises(ValueError):
        cls(max_ops_per_lane=0)
    with pytest.raises(ValueError):
        cls(close_timeout_s=0)
    with pytest.raises(ValueError):
        cls(model_threads=0)


@pytest.mark.parametrize("model_threads,grammar_threads", [(2, 1), (1, 1), (3, 1)])
async def test_lanes_run_torch_at_their_own_thread_counts(model_threads, grammar_threads) -> None:
    """torch's intra-op threads are per thread: the model lane's setting is its own, the grammar
    lane runs at 1 beside a parallel model lane, and the thread that built the timeline keeps its own."""
    import torch

    mine = torch.get_num_threads()
    seen: dict[str, int] = {}
    with CpuTimeline(model_threads=model_threads) as timeline:
        with anyio.fail_after(5):
            timeline.model.launch_host(lambda: seen.__setitem__("model", torch.get_num_threads()))
            timeline.grammar.launch_host(lambda: seen.__setitem__("grammar", torch.get_num_threads()))
            await timeline.model.synchronize()
            await timeline.grammar.synchronize()
    assert (seen["model"], seen["grammar"]) == (model_threads, grammar_threads)
    assert torch.get_num_threads() == mine


async def test_ops_run_in_fifo_order_per_lane(timeline: CpuTimeline) -> None:
    with anyio.fail_after(5):
        seen: list[int] = []
        for i in range(50):
            timeline.grammar.launch_host(seen.append, i)
        await timeline.grammar.synchronize()
        assert seen == list(range(50))
        stats = timeline.statistics().grammar
        assert (stats.ops_run, stats.host_calls, stats.waits_blocked, stats.wait_seconds) == (50, 50, 0, 0.0)


async def test_model_lane_waits_for_the_mask_event(cpu_timeline: CpuTimeline) -> None:
    timeline = cpu_timeline
    with anyio.fail_after(5):
        order: list[str] = []
        gate = threading.Event()
        mask = timeline.new_event()
        timeline.grammar.launch_host(gate.wait)
        timeline.grammar.launch_host(order.append, "mask filled")
        timeline.grammar.record(mask)
        timeline.model.launch_host(order.append, "forward")
        timeline.model.wait(mask)
        timeline.model.launch_host(order.append, "apply mask")
        await wait_until(lambda: timeline.statistics().model.blocked)
        assert order == ["forward"] and not mask.query()
        gate.set()
        await timeline.model.synchronize()
        assert order == ["forward", "mask filled", "apply mask"]
        model = timeline.statistics().model
        assert model.waits_blocked == 1 and model.wait_seconds > 0 and not model.blocked
        assert timeline.statistics().grammar.wait_seconds == 0.0


async def test_no_wait_time_when_the_event_was_already_recorded(timeline: CpuTimeline) -> None:
    with anyio.fail_after(5):
        mask = timeline.new_event()
        timeline.grammar.record(mask)
        await mask.wait_async()
        assert mask.query()
        timeline.model.wait(mask)
        timeline.model.wait(timeline.new_event())  # never recorded: CUDA does not wait either
        await timeline.model.synchronize()
        model = timeline.statistics().model
        assert (model.ops_run, model.waits_blocked, model.wait_seconds) == (2, 0, 0.0)


async def test_reused_events_order_every_step(timeline: CpuTimeline) -> None:
    with anyio.fail_after(5):
        log: list[str] = []
        mask, token = timeline.new_event(), timeline.new_event()
        for step in range(20):
            timeline.grammar.wait(token)  # the previous step's tokens
            timeline.grammar.launch_host(log.append, f"g{step}")
            timeline.grammar.record(mask)
            timeline.model.wait(mask)
            timeline.model.launch_host(log.append, f"m{step}")
            timeline.model.record(token)
        await token.wait_async()
        assert log == [f"{lane}{step}" for step in range(20) for lane in "gm"]


async def test_wait_async_does_not_block_the_loop(timeline: CpuTimeline) -> None:
    with anyio.fail_after(5):
        gate = threading.Event()
        mask = timeline.new_event()
        timeline.grammar.launch_host(gate.wait)
        timeline.grammar.record(mask)
        done = anyio.Event()

        async def waiter() -> None:
            await mask.wait_async()
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert not done.is_set()  # the loop is free while the lane works
            gate.set()
            await done.wait()


async def test_host_exception_fails_the_timeline_and_surfaces_typed(timeline: CpuTimeline) -> None:
    with anyio.fail_after(5):
        ran: list[str] = []
        mask = timeline.new_event()

        def broken() -> None:
            raise ValueError("bad mask")

        timeline.grammar.launch_host(broken)
        timeline.grammar.launch_host(ran.append, "after failure")
        timeline.grammar.record(mask)
        timeline.model.wait(mask)  # would wait forever if the failure did not wake it
        timeline.model.launch_host(ran.append, "model after failure")
        with pytest.raises(TimelineError) as info:
            await timeline.model.synchronize()
        assert isinstance(info.value.__cause__, ValueError)
        with pytest.raises(TimelineError):
            await timeline.grammar.synchronize()
        with pytest.raises(TimelineError):
            await mask.wait_async()
        with pytest.raises(TimelineError):
            timeline.grammar.launch_host(ran.append, "rejected")
        assert ran == []


@pytest.mark.parametrize("cls", [CpuTimeline, CudaRulesTimeline])
async def test_full_lane_raises_instead_of_blocking_the_loop(cls) -> None:
    with anyio.fail_after(5):
        tl = cls(max_ops_per_lane=2)
        started, gate = threading.Event(), threading.Event()

        def hold() -> None:
            started.set()
            gate.wait()

        tl.grammar.launch_host(hold)
        assert started.wait(5)  # the thread took `hold` out of the queue
        tl.grammar.launch_host(int)
        tl.grammar.record(tl.new_event())
        event = tl.new_event()
        with pytest.raises(LaneFullError):
            tl.grammar.record(event)
        assert event.query()  # a record that was refused leaves the event untouched
        gate.set()
        tl.close()
        assert lane_threads() == []


@pytest.mark.parametrize("cls", [CpuTimeline, CudaRulesTimeline])
async def test_close_discards_pending_ops_wakes_waiters_and_reports_a_stuck_host_fn(cls) -> None:
    with anyio.fail_after(5):
        tl = cls(close_timeout_s=0.2)
        ran: list[str] = []
        started, gate = threading.Event(), threading.Event()
        mask = tl.new_event()

        def hold() -> None:
            started.set()
            gate.wait()

        tl.grammar.launch_host(hold)
        tl.grammar.launch_host(ran.append, "discarded")
        tl.grammar.record(mask)
        tl.model.wait(mask)
        tl.model.launch_host(ran.append, "discarded too")
        errors: list[BaseException] = []

        async def waiter() -> None:
            try:
                await mask.wait_async()
            except TimelineClosedError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert started.wait(5)  # `hold` is running, so close() cannot just discard it
            with pytest.raises(TimelineError, match="did not stop"):
                tl.close()  # the grammar lane is still inside gate.wait()
        assert len(errors) == 1 and tl.closed
        gate.set()
        tl.close()
        assert ran == [] and lane_threads() == []
        with pytest.raises(TimelineClosedError):
            tl.model.launch_host(ran.append, "late")
        with pytest.raises(TimelineClosedError):
            await tl.model.synchronize()


def test_events_of_another_timeline_are_rejected(timeline: CpuTimeline) -> None:
    with CpuTimeline() as other:
        with pytest.raises(ValueError):
            timeline.model.wait(other.new_event())
        with pytest.raises(ValueError):
            timeline.grammar.record(object())  # type: ignore[arg-type]


# --- device launches and captured programs ----------------------------------------------------

async def test_launch_runs_on_the_lane_in_order_with_host_functions(cpu_timeline: CpuTimeline) -> None:
    timeline = cpu_timeline
    with anyio.fail_after(5):
        seen: list[tuple[str, str]] = []
        timeline.model.launch_host(lambda: seen.append(("host", threading.current_thread().name)))
        timeline.model.launch(lambda: seen.append(("device", threading.current_thread().name)))
        timeline.model.launch_host(lambda: seen.append(("host", threading.current_thread().name)))
        await timeline.model.synchronize()
        assert [kind for kind, _ in seen] == ["host", "device", "host"]
        assert {thread for _, thread in seen} == {"interlock-model-lane"}


async def test_capture_records_without_running_and_replay_runs_each_time(cpu_timeline: CpuTimeline) -> None:
    timeline = cpu_timeline
    with anyio.fail_after(5):
        seen: list[str] = []
        with timeline.capture() as program:
            timeline.grammar.launch_host(seen.append, "g")
            timeline.model.launch(seen.append, "m")
        await timeline.grammar.synchronize()
        await timeline.model.synchronize()
        assert seen == [] and program.ops == 2
        for _ in range(3):
            timeline.replay(program)
        await timeline.grammar.synchronize()
        await timeline.model.synchronize()
        assert sorted(seen) == ["g"] * 3 + ["m"] * 3


async def test_replayed_events_get_fresh_generations_like_eager_steps(cpu_timeline: CpuTimeline) -> None:
    timeline = cpu_timeline
    """A program whose model lane waits on the grammar lane's event: every replay waits on *its own*
    record, so the model op of replay i always runs after the grammar op of replay i."""
    with anyio.fail_after(5):
        mask = timeline.new_event()
        order: list[str] = []
        gate = threading.Event()
        counter = {"g": 0}

        def grammar_op() -> None:
            gate.wait(5)
            counter["g"] += 1
            order.append(f"g{counter['g']}")

        def model_op() -> None:
            order.append(f"m{counter['g']}")

        with timeline.capture() as program:
            timeline.grammar.launch_host(grammar_op)
            timeline.grammar.record(mask)
            timeline.model.wait(mask)
            timeline.model.launch(model_op)
        timeline.replay(program)
        timeline.replay(program)
        await anyio.sleep(0.01)
        assert order == []              # the model lane waits for replay 1's record, not a stale one
        gate.set()
        await timeline.grammar.synchronize()
        await timeline.model.synchronize()
        model = [int(x[1:]) for x in order if x.startswith("m")]
        assert len(model) == 2 and model[0] >= 1 and model[1] >= 2, order   # replay i's model op saw g_i


def test_capture_does_not_nest_and_an_error_discards_the_program(timeline: CpuTimeline) -> None:
    with timeline.capture():
        with pytest.raises(RuntimeError, match="nest"):
            with timeline.capture():
                pass
    with pytest.raises(KeyError):
        with timeline.capture() as program:
            timeline.model.launch_host(print)
            raise KeyError("boom")
    assert program.closed and program.ops == 0
    with pytest.raises(ValueError, match="closed"):
        timeline.replay(program)


def test_replay_refuses_a_program_of_another_timeline(timeline: CpuTimeline) -> None:
    with CpuTimeline() as other:
        with other.capture() as program:
            other.model.launch_host(print)
        with pytest.raises(ValueError, match="this timeline"):
            timeline.replay(program)


async def test_a_failing_replayed_host_function_fails_the_timeline(timeline: CpuTimeline) -> None:
    with anyio.fail_after(5):
        def boom() -> None:
            raise ZeroDivisionError

        with timeline.capture() as program:
            timeline.model.launch_host(boom)
        timeline.replay(program)
        with pytest.raises(TimelineError):
            await timeline.model.synchronize()
        with pytest.raises(TimelineError):
            timeline.replay(program)
