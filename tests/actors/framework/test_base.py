"""Actor base: start handshake, typed dispatch, ask/reply, stop and failure teardown."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import anyio
import pytest

from interlock.actors.framework.base import Actor, Handler
from interlock.protocol.errors import EngineClosedError, EngineError
from interlock.protocol.errors import ChannelClosedError
from interlock.actors.framework.reply import Reply


@dataclass(frozen=True)
class Add:
    value: int


@dataclass(frozen=True)
class AddTwice(Add):
    pass


@dataclass(frozen=True)
class Total:
    reply: Reply[int]


@dataclass(frozen=True)
class Hang:
    reply: Reply[int]


@dataclass(frozen=True)
class Boom:
    pass


@dataclass(frozen=True)
class Unknown:
    pass


class Counter(Actor[object]):
    """Adds numbers; answers totals; can be told to crash or to never answer."""

    def __init__(self, name: str = "counter", inbox_size: int = 8) -> None:
        super().__init__(name, inbox_size=inbox_size)
        self.total = 0
        self.events: list[str] = []
        self.hanging = anyio.Event()

    def handlers(self) -> Mapping[type, Handler]:
        return {Add: self.on_add, Total: self.on_total, Hang: self.on_hang, Boom: self.on_boom}

    async def on_start(self) -> None:
        self.events.append("start")

    async def on_stop(self) -> None:
        self.events.append("stop")

    async def on_failure(self, exc: BaseException) -> None:
        self.events.append(f"failure:{type(exc).__name__}")

    async def on_add(self, msg: Add) -> None:
        self.total += msg.value * (2 if isinstance(msg, AddTwice) else 1)

    async def on_total(self, msg: Total) -> None:
        msg.reply.set_result(self.total)

    async def on_hang(self, msg: Hang) -> None:
        self.hanging.set()
        await anyio.sleep_forever()

    async def on_boom(self, msg: Boom) -> None:
        raise ZeroDivisionError("boom")


async def test_started_handshake_and_dispatch_by_type() -> None:
    with anyio.fail_after(5):
        actor = Counter()
        async with anyio.create_task_group() as tg:
            await tg.start(actor.run)
            assert actor.started.is_set() and actor.events == ["start"]
            await actor.send(Add(2))
            actor.send_nowait(AddTwice(5))  # dispatched through the base class' handler
            assert await actor.ask(Total) == 12
            actor.stop()
        assert actor.events == ["start", "stop"] and actor.stopped.is_set()
        assert actor.failure is None


async def test_closing_the_inbox_handles_buffered_messages_then_stops() -> None:
    with anyio.fail_after(5):
        actor = Counter()
        for i in range(4):
            actor.send_nowait(Add(i))
        actor.inbox.close()
        await actor.run()
        assert actor.total == 6 and actor.events == ["start", "stop"]


async def test_stop_cancels_a_busy_handler_fails_pending_replies_and_closes_inbox() -> None:
    with anyio.fail_after(5):
        actor = Counter()
        errors: list[BaseException] = []

        async def ask_hang() -> None:
            try:
                await actor.ask(Hang)
            except EngineClosedError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            await tg.start(actor.run)
            tg.start_soon(ask_hang)
            await actor.hanging.wait()
            actor.send_nowait(Add(1))  # left in the inbox: dropped at stop
            actor.stop()
            await actor.stopped.wait()
        assert len(errors) == 1 and not isinstance(errors[0], ChannelClosedError)
        assert actor.total == 0 and actor.events == ["start", "stop"]
        with pytest.raises(ChannelClosedError):
            await actor.send(Add(1))
        with pytest.raises(EngineClosedError):
            await actor.ask(Total)


async def test_handler_exception_runs_on_failure_fails_replies_and_propagates() -> None:
    with anyio.fail_after(5):
        actor = Counter()
        errors: list[BaseException] = []

        async def ask_after_boom() -> None:
            try:
                await actor.ask(Total)
            except EngineError as exc:
                errors.append(exc)

        with pytest.raises(ExceptionGroup) as group:  # structured concurrency: it propagates
            async with anyio.create_task_group() as tg:
                await tg.start(actor.run)
                actor.send_nowait(Boom())
                tg.start_soon(ask_after_boom)  # its Total queues behind Boom: never answered
                await actor.stopped.wait()
        assert group.group_contains(ZeroDivisionError)
        assert actor.events == ["start", "failure:ZeroDivisionError"]
        assert isinstance(actor.failure, ZeroDivisionError)
        assert len(errors) == 1 and isinstance(errors[0].__cause__, ZeroDivisionError)
        assert not isinstance(errors[0], EngineClosedError)


async def test_unknown_message_type_is_a_wiring_bug() -> None:
    with anyio.fail_after(5):
        actor = Counter()
        actor.send_nowait(Unknown())
        with pytest.raises(TypeError, match="no handler for Unknown"):
            await actor.run()
        assert actor.events == ["start", "failure:TypeError"]


async def test_outer_cancellation_stops_cleanly_and_actor_is_single_use() -> None:
    with anyio.fail_after(5):
        actor = Counter()
        async with anyio.create_task_group() as tg:
            await tg.start(actor.run)
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        assert actor.events == ["start", "stop"]
        with pytest.raises(RuntimeError):
            await actor.run()


async def test_stop_before_run_never_reports_started() -> None:
    with anyio.fail_after(5):
        actor = Counter()
        actor.stop()
        await actor.run()
        assert not actor.started.is_set() and actor.stopped.is_set()
        assert actor.events == []  # neither on_start nor on_stop: it never started


def test_bad_config() -> None:
    with pytest.raises(ValueError):
        Counter(inbox_size=0)
