"""DraftActor: owns the drafters (n-gram pools); turns grammar-forced tokens + lookups into drafts."""
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
            if self.ngram is not None:
                drafts.append(tuple(forced_then_ngram(forced, self.ngram, s.request_id, plan.max_draft_len)))
            else:
                drafts.append(tuple(forced[: plan.max_draft_len]))
        await self.grammar.send(DraftProposal(plan, tuple(drafts)))

    async def on_tokens(self, event: TokenEvent) -> None:
        if self.ngram is not None:
            for r in event.results:
                self.ngram.extend(r.request_id, r.new_tokens)
