"""The Drafter Protocol for user-provided drafters (a later issue extends it, e.g. draft probs)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from interlock.protocol.speculative import DraftRequest
from interlock.protocol.types import TokenId


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens for a step's sampling requests; synchronous and quick (it runs on the model
    lane's thread, inside the step, before the target forward). Any proposal is safe: verification keeps the output exactly the
    target's, so a bad drafter costs speed, never correctness. See examples/user_drafter.py."""

    def propose(self, requests: Sequence[DraftRequest], k: int) -> list[list[TokenId]]:
        """Up to k draft tokens per request, in order ([] for none). `tokens` is the request's prompt
        plus its committed output; the drafts continue it."""
        ...
