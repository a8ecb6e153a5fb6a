"""The Drafter Protocol for user-provided drafters (a later issue extends it, e.g. draft probs)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from interlock.protocol.messages import RequestSnapshot
from interlock.protocol.types import TokenId


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens for a step's sampled requests; synchronous and quick (it runs between
    steps on the event loop)."""

    def propose(self, snapshots: Sequence[RequestSnapshot], k: int) -> list[list[TokenId]]:
        """Up to k draft tokens per snapshot, in snapshot order ([] for none). A snapshot's
        `context` is its prompt + committed output and `chunk[-1]` its last token."""
        ...
