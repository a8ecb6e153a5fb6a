"""Reply slots: one answer, late answers ignored, teardown fails every pending reply."""
from __future__ import annotations

import anyio
import pytest

from interlock.protocol.errors import EngineClosedError
from interlock.actors.framework.reply import PendingReplies, Reply


async def test_result_reaches_the_waiter_once() -> None:
    with anyio.fail_after(5):
        reply: Reply[int] = Reply()
        got: list[int] = []

        async def waiter() -> None:
            got.append(await reply.wait_result())

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert reply.set_result(3)
            assert not reply.set_result(4)
            assert not reply.set_exception(RuntimeError("late"))
        assert got == [3]
        assert await reply.wait_result() == 3


async def test_fail_all_fails_waiters_and_refuses_new_slots() -> None:
    with anyio.fail_after(5):
        book = PendingReplies()
        answered: Reply[str] = book.new()
        pending = [book.new() for _ in range(3)]
        answered.set_result("ok")
        assert len(book) == 3
        errors: list[BaseException] = []

        async def waiter(reply: Reply[str]) -> None:
            try:
                await reply.wait_result()
            except EngineClosedError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for reply in pending:
                tg.start_soon(waiter, reply)
            await anyio.wait_all_tasks_blocked()
            assert book.fail_all(EngineClosedError("actor stopped")) == 3
        assert len(errors) == 3 and len(book) == 0
        assert await answered.wait_result() == "ok"
        with pytest.raises(EngineClosedError):
            book.new()
