"""One-shot reply slots for request/reply between tasks, and the book an actor keeps of them.

The asker creates a `Reply` through the answering actor's `PendingReplies`, puts it inside the
message and awaits `reply.wait()`. The actor answers with `set_result` / `set_exception`. When
the actor stops or fails it calls `fail_all(exc)`, so nobody waits on an answer that can no
longer come (pykka: "teardown fails pending replies"). Everything runs on one event loop.
"""
from __future__ import annotations

from typing import Any, Generic, TypeVar

import anyio

T = TypeVar("T")

_UNSET = object()


class Reply(Generic[T]):
    """A value or an exception, set once, awaited by whoever asked.

    Setting it twice is allowed and ignored (returns False): a late answer after a teardown
    already failed the slot, or after the asker was cancelled, must not crash the answerer.
    """

    def __init__(self, book: PendingReplies | None = None) -> None:
        self._event = anyio.Event()
        self._value: object = _UNSET
        self._error: BaseException | None = None
        self._book = book

    def done(self) -> bool:
        """True once a result or an exception was set."""
        return self._event.is_set()

    def set_result(self, value: T) -> bool:
        """Answer with `value`; False if the slot was already answered."""
        if self.done():
            return False
        self._value = value
        self._settle()
        return True

    def set_exception(self, exc: BaseException) -> bool:
        """Answer with an error that `wait()` will raise; False if already answered."""
        if self.done():
            return False
        self._error = exc
        self._settle()
        return True

    async def wait_result(self) -> T:
        """Wait for the answer; return it or raise the exception it was failed with."""
        await self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def _settle(self) -> None:
        self._event.set()
        if self._book is not None:
            self._book._discard(self)


class PendingReplies:
    """The replies an actor still owes; `fail_all` settles them all with one error."""

    def __init__(self) -> None:
        self._pending: set[Reply[Any]] = set()        # replies of every value type an actor answers
        self._closed_with: BaseException | None = None

    def new(self) -> Reply[T]:
        """A fresh reply slot; raises the teardown error if the owner has already stopped."""
        if self._closed_with is not None:
            raise self._closed_with
        reply: Reply[T] = Reply(self)
        self._pending.add(reply)
        return reply

    def fail_all(self, exc: BaseException) -> int:
        """Fail every pending reply with `exc` and refuse new ones; returns how many were failed."""
        if self._closed_with is None:
            self._closed_with = exc
        pending = list(self._pending)
        for reply in pending:
            reply.set_exception(exc)
        return len(pending)

    def __len__(self) -> int:
        return len(self._pending)

    def _discard(self, reply: Reply[Any]) -> None:
        self._pending.discard(reply)

