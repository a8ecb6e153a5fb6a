"""DraftActor: owns the drafters (n-gram pools); turns grammar-forced tokens + lookups into drafts.

Adaptive draft length: each request has a lookup budget k (1..K). A step that accepts every draft
raises it by one; a rejection sets it to accepted + 1. Forced tokens are accepted whatever the
model says, so they never count against it. It changes how much is verified, never what is
emitted: verification is exact for any draft.
"""
from __future__ import annotations

from collections.abc import Mapping

from interlock.actors.base import Actor, Handler
from interlock.drafters.combine import forced_then_ngram
from interlock.drafters.ngram import NGramDrafter
from interlock.protocol.messages import AddRequest, Count, DraftProposal, Forced, Release, TokenEvent
from interlock.protocol.speculative import SpeculativeConfig


class DraftActor(Actor[object]):
    def __init__(self, config: SpeculativeConfig | None, grammar: Actor[object]) -> None:
        self.config = config
        self.grammar = grammar
        use_ngram = config is not None and "ngram" in config.drafters
        self.ngram = NGramDrafter(config.ngram, config.max_draft_len) if use_ngram else None
        self.use_forced = config is not None and "forced" in config.drafters
        self.budget: dict[str, int] = {}        # adaptive: lookup tokens per request
        super().__init__("draft")

    def handlers(self) -> Mapping[type, Handler]:
        return {AddRequest: self.on_add, Release: self.on_release, Forced: self.on_forced,
                TokenEvent: self.on_tokens, Count: self.on_count}

    async def on_add(self, msg: AddRequest) -> None:
        if self.ngram is not None:
            self.ngram.add_request(msg.request_id, msg.prompt)

    async def on_release(self, msg: Release) -> None:
        if self.ngram is not None:
            self.ngram.remove(msg.request_id)
        self.budget.pop(msg.request_id, None)

    async def on_count(self, msg: Count) -> None:
        msg.reply.set_result(self.ngram.stats().requests if self.ngram is not None else 0)

    async def on_forced(self, msg: Forced) -> None:
        plan = msg.plan
        drafts = []
        for s, forced in zip(plan.snapshots, msg.tokens):
            if not s.sample or self.config is None:
                drafts.append(())
                continue
            forced = forced if self.use_forced else ()
            k = plan.max_draft_len
            if self.ngram is not None:
                if self.config.adaptive:
                    k = min(k, len(forced) + self.budget.get(s.request_id, k))
                drafts.append(tuple(forced_then_ngram(forced, self.ngram, s.request_id, k)))
            else:
                drafts.append(tuple(forced[:k]))
        await self.grammar.send(DraftProposal(plan, tuple(drafts)))

    async def on_tokens(self, event: TokenEvent) -> None:
        if self.ngram is None:
            return
        k = self.config.max_draft_len if self.config is not None else 0
        for r in event.results:
            self.ngram.extend(r.request_id, r.new_tokens)
            if self.config.adaptive and r.drafted:
                budget = self.budget.get(r.request_id, k)
                self.budget[r.request_id] = min(k, budget + 1) if r.accepted == r.drafted else max(1, r.accepted + 1)
