"""The Drafter protocol every lookup drafter implements, and `Tracked`, the per-request hooks of the
ones that keep state. DraftChain (chain.py) combines them; a user drafter is one more member.

A drafter answers, per request, up to k tokens that continue the request's sequence. Any answer is
safe: verification keeps the output exactly the target's, so a bad drafter costs speed, never
correctness. Drafters run on the model lane's thread, inside the step, before the target forward:
they must be synchronous and quick. See examples/user_drafter.py.

The draft model implements `Tracked` and drafts in rounds instead of one `propose` call
(drafters/model.py): between two of its tokens the grammar lane writes the draft-side mask row,
so one call cannot hold the whole draft without the model lane waiting on the grammar lane
inside a host function — which a captured CUDA graph could not replay.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from interlock.protocol.speculative import DraftRequest
from interlock.protocol.types import RequestId, TokenId


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens for a step's sampling requests."""

    def propose(self, requests: Sequence[DraftRequest], k: int) -> Sequence[Sequence[TokenId]]:
        """Up to k draft tokens per request, in order ([] for none), continuing `request.tokens`
        (a drafter that continues past `request.forced` returns the forced tokens first)."""
        ...


@runtime_checkable
class Tracked(Protocol):
    """Per-request hooks of a drafter that keeps state (an index, a cache); the chain calls them in
    lane order, so the state is only ever touched by the model lane's thread."""

    def add(self, request_id: RequestId, prompt: tuple[TokenId, ...]) -> None:
        """A new request and its prompt."""
        ...

    def commit(self, request_id: RequestId, new_tokens: tuple[TokenId, ...]) -> None:
        """A step's committed tokens (accepted drafts + the target's token) for this request."""
        ...

    def remove(self, request_id: RequestId) -> None:
        """The request is finished, cancelled or failed; idempotent."""
        ...

    def counts(self) -> dict[str, int]:
        """What it holds, for engine.resources() (per-request entries must be 0 when idle)."""
        ...
