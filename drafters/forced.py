"""ForcedDrafter: the grammar's forced (jump-forward) tokens are drafts for free.

The grammar allows nothing else there, so the target accepts them whenever it would not stop
first. The GrammarActor computes them on the grammar lane (they arrive in DraftRequest.forced);
this drafter only turns them into the chain's first, highest-priority answer. It keeps nothing per
request; its hooks are there to say so (a member without them would be handed each request's
tokens every step).
"""
from __future__ import annotations

from collections.abc import Sequence

from interlock.protocol.speculative import DraftRequest
from interlock.protocol.types import RequestId, TokenId


class ForcedDrafter:
    def propose(self, requests: Sequence[DraftRequest], k: int) -> list[tuple[TokenId, ...]]:
        return [r.forced[:k] for r in requests]

    def add(self, request_id: RequestId, prompt: tuple[TokenId, ...]) -> None:
        pass

    def commit(self, request_id: RequestId, new_tokens: tuple[TokenId, ...]) -> None:
        pass

    def remove(self, request_id: RequestId) -> None:
        pass

    def counts(self) -> dict[str, int]:
        return {}
