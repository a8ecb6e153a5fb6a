"""Channel: bounds, blocking and non-blocking calls, close semantics, statistics."""
from __future__ import annotations

import anyio
import pytest

from interlock.actors.framework.channel import Channel
from interlock.protocol.errors import (
    ChannelClosedError,
    ChannelEmptyError,
    ChannelFullError,
    EndOfChannelError,
)


@pytest.mark.parametrize("bad", [0, -1, 1.5, None, True])
def test_buffer_must_be_bounded_and_positive(bad: object) -> None:
    with pytest.raises(ValueError):
        Channel(bad)  # type: ignore[arg-type]


async def test_send_nowait_raises_when_full_and_fifo_order() -> None:
    with anyio.fail_after(5):
        ch: Channel[int] = Channel(2)
        ch.send_nowait(1)
        ch.send_nowait(2)
        with pytest.raises(ChannelFullError):
            ch.send_nowait(3)
        assert [ch.receive_nowait(), await ch.receive()] == [1, 2]
        with pytest.raises(ChannelEmptyError):
            ch.receive_nowait()


async def test_send_blocks_until_a_receive_makes_room() -> None:
    with anyio.fail_after(5):
        ch: Channel[int] = Channel(1)
        ch.send_nowait(1)
        sent = anyio.Event()

        async def sender() -> None:
            await ch.send(2)
            sent.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(sender)
            await anyio.wait_all_tasks_blocked()
            assert not sent.is_set()
            assert ch.statistics().senders_waiting == 1
            assert await ch.receive() == 1
            await sent.wait()
        assert ch.receive_nowait() == 2


async def test_close_lets_receiver_drain_then_stop() -> None:
    with anyio.fail_after(5):
        ch: Channel[str] = Channel(4)
        await ch.send("a")
        ch.send_nowait("b")
        ch.close()
        ch.close()  # idempotent
        with pytest.raises(ChannelClosedError):
            ch.send_nowait("c")
        with pytest.raises(ChannelClosedError):
            await ch.send("c")
        assert [item async for item in ch] == ["a", "b"]
        with pytest.raises(EndOfChannelError):
            await ch.receive()
        with pytest.raises(EndOfChannelError):
            ch.receive_nowait()


async def test_close_fails_a_blocked_sender_and_withdraws_its_item() -> None:
    with anyio.fail_after(5):
        ch: Channel[int] = Channel(1)
        ch.send_nowait(1)
        errors: list[BaseException] = []

        async def sender() -> None:
            try:
                await ch.send(2)
            except ChannelClosedError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(sender)
            await anyio.wait_all_tasks_blocked()
            ch.close()
        assert len(errors) == 1
        assert ch.drain_nowait() == [1]


async def test_close_wakes_a_waiting_receiver() -> None:
    with anyio.fail_after(5):
        ch: Channel[int] = Channel(1)
        got: list[int] = []

        async def consumer() -> None:
            async for item in ch:
                got.append(item)

        async with anyio.create_task_group() as tg:
            tg.start_soon(consumer)
            await anyio.wait_all_tasks_blocked()
            assert ch.statistics().receivers_waiting == 1
            await ch.send(7)
            ch.close()
        assert got == [7]


async def test_statistics_snapshot() -> None:
    with anyio.fail_after(5):
        ch: Channel[int] = Channel(3)
        for i in range(3):
            ch.send_nowait(i)
        ch.receive_nowait()
        ch.send_nowait(9)
        stats = ch.statistics()
        assert (stats.buffered, stats.max_buffer, stats.total_sent, stats.closed) == (3, 3, 4, False)
        assert (stats.senders_waiting, stats.receivers_waiting) == (0, 0)
        with pytest.raises(AttributeError):
            stats.buffered = 0  # type: ignore[misc]
        assert ch.drain_nowait() == [1, 2, 9]
        assert ch.statistics().closed


async def test_cancelled_sender_does_not_count_or_deliver() -> None:
    with anyio.fail_after(5):
        ch: Channel[int] = Channel(1)
        ch.send_nowait(1)
        async with anyio.create_task_group() as tg:
            tg.start_soon(ch.send, 2)
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        assert ch.statistics().total_sent == 1
        assert ch.drain_nowait() == [1]
