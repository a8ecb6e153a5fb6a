"""Runtime: ordered start handshake, reverse stop, one crash stops all and is reported once."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import anyio
import pytest

from interlock.actors.framework.base import Actor, Handler
from interlock.actors.framework.runtime import Runtime
from interlock.protocol.errors import EngineError
from interlock.actors.framework.reply import Reply


@dataclass(frozen=True)
class Ping:
    reply: Reply[str]


@dataclass(frozen=True)
class Crash:
    pass


@dataclass(frozen=True)
class Relay:
    """Ask another actor and wait: a handler blocked on a peer when the peer crashes."""

    to: Actor[object]
    reply: Reply[str]


class Node(Actor[object]):
    def __init__(self, name: str, log: list[str], *, fail_start: bool = False) -> None:
        super().__init__(name, inbox_size=4)
        self.log = log
        self.fail_start = fail_start
        self.peers_started_at_start: list[bool] = []

    def handlers(self) -> Mapping[type, Handler]:
        return {Ping: self.on_ping, Crash: self.on_crash, Relay: self.on_relay}

    async def on_start(self) -> None:
        await anyio.lowlevel.checkpoint()
        if self.fail_start:
            raise OSError(f"{self.name} cannot start")
        self.log.append(f"start {self.name}")

    async def on_stop(self) -> None:
        self.log.append(f"stop {self.name}")

    async def on_failure(self, exc: BaseException) -> None:
        self.log.append(f"failure {self.name}")

    async def on_ping(self, msg: Ping) -> None:
        msg.reply.set_result(f"pong from {self.name}")

    async def on_crash(self, msg: Crash) -> None:
        raise ZeroDivisionError(f"{self.name} crashed")

    async def on_relay(self, msg: Relay) -> None:
        msg.reply.set_result(await msg.to.ask(Ping))


class Recorder:
    """The failure callback: what the engine would use to fail every in-flight request."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, BaseException]] = []

    def __call__(self, actor_name: str, exc: BaseException) -> None:
        self.calls.append((actor_name, exc))


def nodes(log: list[str], *names: str) -> list[Node]:
    return [Node(name, log) for name in names]


class Ordered(Node):
    """Checks that every actor before it had finished its start handshake."""

    def __init__(self, name: str, log: list[str], before: list[Actor[object]]) -> None:
        super().__init__(name, log)
        self.before = before

    async def on_start(self) -> None:
        self.peers_started_at_start = [a.started.is_set() for a in self.before]
        await super().on_start()


def test_bad_config() -> None:
    with pytest.raises(ValueError):
        Runtime([])
    with pytest.raises(ValueError):
        Runtime(nodes([], "a", "a"))


async def test_starts_in_order_and_stops_in_reverse() -> None:
    with anyio.fail_after(5):
        log: list[str] = []
        a = Node("a", log)
        b = Ordered("b", log, [a])
        c = Ordered("c", log, [a, b])
        runtime = Runtime([a, b, c])
        async with runtime:
            assert runtime.ready
            assert log == ["start a", "start b", "start c"]
            assert b.peers_started_at_start == [True] and c.peers_started_at_start == [True, True]
            assert await c.ask(Ping) == "pong from c"
        assert not runtime.ready and runtime.failure is None
        assert log[3:] == ["stop c", "stop b", "stop a"]
        with pytest.raises(RuntimeError):
            await runtime.__aenter__()


async def test_crash_stops_the_others_calls_back_once_and_does_not_cancel_the_caller() -> None:
    with anyio.fail_after(5):
        log: list[str] = []
        a, b, c = nodes(log, "a", "b", "c")
        failed = Recorder()
        runtime = Runtime([a, b, c], on_failure=failed)
        body_finished = False
        with pytest.raises(EngineError) as info:
            async with runtime:
                b.send_nowait(Crash())
                await runtime.wait_done()
                await anyio.lowlevel.checkpoint()  # the caller's code was not cancelled
                body_finished = True
        assert body_finished
        assert isinstance(info.value.__cause__, ZeroDivisionError)
        assert [(name, type(exc)) for name, exc in failed.calls] == [("b", ZeroDivisionError)]
        assert runtime.failed_actor == "b" and not runtime.ready
        assert "failure b" in log and {"stop a", "stop c"} <= set(log)
        assert all(actor.stopped.is_set() for actor in (a, b, c))


async def test_a_handler_waiting_on_the_crashed_actor_gets_an_engine_error() -> None:
    with anyio.fail_after(5):
        log: list[str] = []
        a, b = nodes(log, "a", "b")
        runtime = Runtime([a, b], on_failure=Recorder())
        with pytest.raises(EngineError):
            async with runtime:
                b.send_nowait(Crash())  # b crashes before it can answer a's relayed ping
                a.send_nowait(Relay(b, Reply()))
                await runtime.wait_done()
        assert a.stopped.is_set() and b.stopped.is_set()


async def test_failed_start_stops_started_actors_and_raises() -> None:
    with anyio.fail_after(5):
        log: list[str] = []
        a, c = Node("a", log), Node("c", log)
        b = Node("b", log, fail_start=True)
        failed = Recorder()
        runtime = Runtime([a, b, c], on_failure=failed)
        with pytest.raises(EngineError) as info:
            async with runtime:
                pytest.fail("the body must not run when a start failed")
        assert isinstance(info.value.__cause__, OSError)
        assert [name for name, _ in failed.calls] == ["b"]
        assert log == ["start a", "failure b", "stop a"]
        assert not c.started.is_set()


async def test_run_until_stop() -> None:
    with anyio.fail_after(5):
        log: list[str] = []
        runtime = Runtime(nodes(log, "a", "b"))
        async with anyio.create_task_group() as tg:
            await tg.start(runtime.run)
            assert runtime.ready and log == ["start a", "start b"]
            runtime.stop()
        assert log[2:] == ["stop b", "stop a"]


async def test_run_raises_engine_error_after_a_crash() -> None:
    with anyio.fail_after(5):
        log: list[str] = []
        a, b = nodes(log, "a", "b")
        runtime = Runtime([a, b])
        with pytest.raises(ExceptionGroup) as group:  # from this test's own task group
            async with anyio.create_task_group() as tg:
                await tg.start(runtime.run)
                a.send_nowait(Crash())
        assert group.group_contains(EngineError)
        assert b.stopped.is_set()


async def test_cancelling_the_owner_stops_every_actor() -> None:
    with anyio.fail_after(5):
        log: list[str] = []
        actors = nodes(log, "a", "b", "c")
        entered = anyio.Event()

        async def owner() -> None:
            async with Runtime(actors):
                entered.set()
                await anyio.sleep_forever()

        async with anyio.create_task_group() as tg:
            tg.start_soon(owner)
            await entered.wait()
            tg.cancel_scope.cancel()
        assert log[3:] == ["stop c", "stop b", "stop a"]
        assert all(actor.stopped.is_set() for actor in actors)


class SlowStart(Node):
    """An on_start that never finishes by itself (waits for a peer that will not come)."""

    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__(name, log)
        self.in_start = anyio.Event()

    async def on_start(self) -> None:
        self.in_start.set()
        await anyio.sleep_forever()


async def test_crash_while_a_later_actor_is_starting_does_not_hang() -> None:
    with anyio.fail_after(5):
        log: list[str] = []
        a, b = Node("a", log), SlowStart("b", log)
        a.send_nowait(Crash())  # handled as soon as a has started, while b is starting
        failed = Recorder()
        with pytest.raises(EngineError) as info:
            async with Runtime([a, b], on_failure=failed):
                pytest.fail("the body must not run")
        assert isinstance(info.value.__cause__, ZeroDivisionError)
        assert [name for name, _ in failed.calls] == ["a"]
        assert a.stopped.is_set() and b.stopped.is_set() and not b.started.is_set()


async def test_cancelling_the_owner_during_start_does_not_hang() -> None:
    with anyio.fail_after(5):
        log: list[str] = []
        a, b = Node("a", log), SlowStart("b", log)

        async def owner() -> None:
            async with Runtime([a, b]):
                pytest.fail("the body must not run")

        async with anyio.create_task_group() as tg:
            tg.start_soon(owner)
            await b.in_start.wait()
            tg.cancel_scope.cancel()
        assert log == ["start a", "stop a"]
        assert a.stopped.is_set() and b.stopped.is_set()
