"""A bounded, closable channel: the inbox of an actor.

A thin typed wrapper over anyio's memory object stream (which already gets waiting, hand-off
and cancellation right). It adds what the actors need on top: one object that every sender
shares, a buffer that must be bounded (N >= 1), typed errors from `protocol/errors.py`,
`close()` semantics in one place, and a frozen `statistics()` snapshot with a running count of
items sent.

Close semantics (trio's and anyio's): after `close()` every send raises `ChannelClosedError`,
including sends that were blocked waiting for room (their items are withdrawn); the receiver
still gets everything that was buffered, then iteration stops and `receive()` raises
`EndOfChannelError`.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import anyio

from interlock.protocol.errors import (
    ChannelClosedError,
    ChannelEmptyError,
    ChannelFullError,
    EndOfChannelError,
)

T = TypeVar("T")


@dataclass(frozen=True)
class ChannelStatistics:
    """A snapshot of one channel, for metrics and tests."""

    buffered: int           # items waiting in the buffer
    max_buffer: int         # capacity the channel was created with
    senders_waiting: int    # tasks blocked in send() because the buffer is full
    receivers_waiting: int  # tasks blocked in receive() because the buffer is empty
    total_sent: int         # items accepted since creation
    closed: bool


class Channel(Generic[T]):
    """A bounded FIFO channel shared by any number of senders and (usually) one receiver.

    `max_buffer` is the number of items it holds before `send()` waits and `send_nowait()`
    raises `ChannelFullError`; it must be at least 1, because an unbounded queue hides
    back-pressure and an unbuffered one makes every `send_nowait` from sync code fail.
    """

    def __init__(self, max_buffer: int) -> None:
        if isinstance(max_buffer, bool) or not isinstance(max_buffer, int) or max_buffer < 1:
            raise ValueError(f"max_buffer must be an int >= 1, got {max_buffer!r}")
        self._max_buffer = max_buffer
        self._send, self._receive = anyio.create_memory_object_stream[T](max_buffer)
        self._total_sent = 0
        self._closed = False

    async def send(self, item: T) -> None:
        """Send `item`, waiting while the buffer is full. Raises `ChannelClosedError`."""
        try:
            await self._send.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise ChannelClosedError("channel is closed") from None
        self._total_sent += 1

    def send_nowait(self, item: T) -> None:
        """Send `item` now; raises `ChannelFullError` when full, `ChannelClosedError` when closed."""
        try:
            self._send.send_nowait(item)
        except anyio.WouldBlock:
            raise ChannelFullError(f"channel is full ({self._max_buffer} items)") from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise ChannelClosedError("channel is closed") from None
        self._total_sent += 1

    async def receive(self) -> T:
        """Receive the next item, waiting while empty; `EndOfChannelError` once closed and drained."""
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._receive.close()
            raise EndOfChannelError("channel is closed and drained") from None

    def receive_nowait(self) -> T:
        """Receive now; `ChannelEmptyError` when nothing is buffered, `EndOfChannelError` at the end."""
        try:
            return self._receive.receive_nowait()
        except anyio.WouldBlock:
            raise ChannelEmptyError("channel is empty") from None
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._receive.close()
            raise EndOfChannelError("channel is closed and drained") from None

    def close(self) -> None:
        """Stop accepting items (idempotent). Buffered items can still be received."""
        self._closed = True
        self._send.close()

    def drain_nowait(self) -> list[T]:
        """Close, then take every buffered item out (for teardown: fail or log what was left)."""
        self.close()
        left: list[T] = []
        while True:
            try:
                left.append(self.receive_nowait())
            except EndOfChannelError:
                return left

    @property
    def closed(self) -> bool:
        """True once `close()` was called."""
        return self._closed

    def statistics(self) -> ChannelStatistics:
        """A frozen snapshot of the buffer, the waiting tasks and the running total."""
        s = self._send.statistics()
        return ChannelStatistics(
            buffered=s.current_buffer_used,
            max_buffer=self._max_buffer,
            senders_waiting=s.tasks_waiting_send,
            receivers_waiting=s.tasks_waiting_receive,
            total_sent=self._total_sent,
            closed=self.closed,
        )

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.receive()
        except EndOfChannelError:
            raise StopAsyncIteration from None

    def __del__(self) -> None:
        # Both anyio ends warn (ResourceWarning) when collected open; a dropped channel is
        # finished by definition, so close them quietly. Runs before the ends are collected.
        send = getattr(self, "_send", None)
        if send is not None:
            send.close()
            self._receive.close()
