"""OutputStream: bounded, non-blocking producer, on_room, finish/fail, cancellation exactly once."""
from __future__ import annotations

import contextlib
import gc

import anyio
import pytest

from interlock.protocol.errors import EngineError
from interlock.protocol.errors import ChannelClosedError
from interlock.output.stream import OutputStream


class Calls:
    """Counts callback invocations and lets a test wait for the first one."""

    def __init__(self) -> None:
        self.count = 0
        self.event = anyio.Event()

    def __call__(self) -> None:
        self.count += 1
        self.event.set()


@pytest.mark.parametrize("bad", [0, -3, 2.0, True])
def test_capacity_must_be_positive_int(bad: object) -> None:
    with pytest.raises(ValueError):
        OutputStream(bad)  # type: ignore[arg-type]


async def test_bounded_try_put_and_on_room_when_a_full_buffer_drains() -> None:
    with anyio.fail_after(5):
        on_room = Calls()
        stream: OutputStream[int] = OutputStream(2, on_room=on_room)
        assert stream.try_put(1) and stream.try_put(2)
        assert not stream.has_room()
        assert not stream.try_put(3)  # full: the producer pauses instead of waiting
        assert await stream.receive() == 1
        assert on_room.count == 1 and stream.has_room()
        assert stream.try_put(3)
        assert await stream.receive() == 2
        assert on_room.count == 2
        assert await stream.receive() == 3  # buffer was not full: no extra wake-up
        assert on_room.count == 2
        assert stream.statistics().total_put == 3


async def test_finish_delivers_buffered_items_then_stops() -> None:
    with anyio.fail_after(5):
        on_cancel = Calls()
        stream: OutputStream[str] = OutputStream(4, on_cancel=on_cancel)
        for item in "abc":
            stream.try_put(item)
        stream.finish()
        assert [item async for item in stream] == ["a", "b", "c"]
        with pytest.raises(ChannelClosedError):
            stream.try_put("d")
        await stream.aclose()
        assert on_cancel.count == 0 and stream.state == "finished"


async def test_fail_raises_after_buffered_items() -> None:
    with anyio.fail_after(5):
        stream: OutputStream[int] = OutputStream(4)
        stream.try_put(1)
        stream.fail(EngineError("verifier crashed"))
        got: list[int] = []
        with pytest.raises(EngineError, match="verifier crashed"):
            async for item in stream:
                got.append(item)
        assert got == [1]


async def test_consumer_waits_for_producer() -> None:
    with anyio.fail_after(5):
        stream: OutputStream[int] = OutputStream(1)
        got: list[int] = []

        async def consume() -> None:
            async for item in stream:
                got.append(item)

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            for i in range(5):
                await anyio.wait_all_tasks_blocked()
                assert stream.try_put(i)
            await anyio.wait_all_tasks_blocked()
            stream.finish()
        assert got == [0, 1, 2, 3, 4]


async def test_aclose_and_async_with_cancel_exactly_once() -> None:
    with anyio.fail_after(5):
        on_cancel = Calls()
        stream: OutputStream[int] = OutputStream(2, on_cancel=on_cancel)
        stream.try_put(1)
        async with stream:
            async for _ in stream:
                break
        await stream.aclose()
        stream.cancel()
        assert on_cancel.count == 1 and stream.state == "cancelled"
        assert stream.try_put(2)  # dropped: the cancel is already on its way to the producer
        assert [item async for item in stream] == []
        stream.finish()
        assert stream.state == "cancelled"


async def test_cancelling_the_waiting_task_cancels_the_stream() -> None:
    with anyio.fail_after(5):
        on_cancel = Calls()
        stream: OutputStream[int] = OutputStream(2, on_cancel=on_cancel)
        async with anyio.create_task_group() as tg:
            tg.start_soon(stream.receive)
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        assert on_cancel.count == 1 and stream.state == "cancelled"


async def test_breaking_out_of_iterate_cancels_once_generator_is_dropped() -> None:
    # The engine's pattern: generate() is an async generator; `break` + drop -> aclose().
    with anyio.fail_after(5):
        on_cancel = Calls()
        stream: OutputStream[int] = OutputStream(4, on_cancel=on_cancel)
        stream.try_put(1)
        stream.try_put(2)
        async for _ in stream.iterate():
            break
        gc.collect()  # CPython frees it at once; this keeps the test honest elsewhere
        await on_cancel.event.wait()  # asyncio's asyncgen finalizer runs aclose() soon after
        assert on_cancel.count == 1


async def test_aclosing_cancels_before_the_next_line() -> None:
    with anyio.fail_after(5):
        on_cancel = Calls()
        stream: OutputStream[int] = OutputStream(4, on_cancel=on_cancel)
        stream.try_put(1)
        async with contextlib.aclosing(stream.iterate()) as items:
            async for _ in items:
                break
        assert on_cancel.count == 1


async def test_cancel_in_loop_body_cancels_through_iterate() -> None:
    # Cancellation that lands in the user's loop body, not inside the stream's own wait.
    with anyio.fail_after(5):
        on_cancel = Calls()
        stream: OutputStream[int] = OutputStream(4, on_cancel=on_cancel)
        stream.try_put(1)
        in_body = anyio.Event()

        async def consume() -> None:
            async with contextlib.aclosing(stream.iterate()) as items:
                async for _ in items:
                    in_body.set()
                    await anyio.sleep_forever()

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await in_body.wait()
            tg.cancel_scope.cancel()
        assert on_cancel.count == 1


async def test_iterate_to_the_end_does_not_cancel() -> None:
    with anyio.fail_after(5):
        on_cancel = Calls()
        stream: OutputStream[int] = OutputStream(4, on_cancel=on_cancel)
        stream.try_put(1)
        stream.finish()
        assert [item async for item in stream.iterate()] == [1]
        assert on_cancel.count == 0


async def test_slow_consumer_does_not_block_producer_or_other_streams() -> None:
    with anyio.fail_after(5):
        slow_room = Calls()
        slow: OutputStream[int] = OutputStream(2, on_room=slow_room)
        fast: OutputStream[int] = OutputStream(2)
        got: list[int] = []

        async def consume_fast() -> None:
            async for item in fast:
                got.append(item)

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume_fast)
            paused = False
            for step in range(10):  # the scheduler's steps: never awaits a consumer
                paused = paused or not slow.try_put(step)
                assert fast.try_put(step)
                await anyio.wait_all_tasks_blocked()  # let the fast consumer run
            fast.finish()
        assert got == list(range(10))
        assert paused and slow.statistics().buffered == 2 and slow_room.count == 0
        assert await slow.receive() == 0
        assert slow_room.count == 1  # the paused request is woken when its reader returns
