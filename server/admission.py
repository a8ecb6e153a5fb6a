"""Bounded admission: at most `limit` engine requests (choices) in flight; past it, 429.

The engine queues what it cannot run yet without bound, so the server is where the bound lives.
A request takes all its n choices at once or none (no partial admission, no waiting).
"""
from __future__ import annotations

from interlock.server.errors import APIError


class Admission:
    """A counter, not a semaphore: a full server answers at once (429 + Retry-After) instead of
    holding the connection, which is what OpenAI clients retry on."""

    def __init__(self, limit: int, retry_after_s: int) -> None:
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.in_flight = 0
        self.draining = False

    def acquire(self, n: int) -> Ticket:
        if self.draining:
            raise APIError(503, "the server is shutting down", code="shutting_down")
        if n > self.limit:
            raise APIError(400, f"n={n} exceeds what this server admits at once ({self.limit})", param="n")
        if self.in_flight + n > self.limit:
            raise APIError(429, f"the server is at capacity ({self.in_flight} of {self.limit} requests in flight); "
                                "retry later", code="queue_full", headers={"Retry-After": str(self.retry_after_s)})
        self.in_flight += n
        return Ticket(self, n)


class Ticket:
    """What one admitted request holds; `release()` is idempotent."""

    def __init__(self, admission: Admission, n: int) -> None:
        self._admission, self._n = admission, n

    def release(self) -> None:
        self._admission.in_flight -= self._n
        self._n = 0
