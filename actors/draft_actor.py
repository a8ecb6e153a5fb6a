"""DraftActor: owns the drafters (n-gram pools); turns grammar-forced tokens + lookups into drafts.

Adaptive draft length: each request has a lookup budget k (1..K). A step that accepts every draft
raises it by one; a rejection sets it to accepted + 1. Forced tokens are accepted whatever the
model says, so they never count against it. It changes how much is verified, never what is
emitted: verification is exact for any draft.
"""
from __future__ import annotations

from collections.abc import Mapping

from interlock.actors.base import Actor, Handler
from interlock.drafters.combine import combine_drafts, forced_then_ngram
from interlock.drafters.ngram import NGramDrafter
from interlock.protocol.messages import AddRequest, Count, DraftProposal, Forced, Release, RequestSnapshot, TokenEvent
from interlock.protocol.speculative import DraftRequest, SpeculativeConfig


class DraftActor(Actor[object]):
    def __init__(self, config: SpeculativeConfig | None, grammar: Actor[object], vocab_size: int) -> None:
        self.config = config
        self.vocab_size = vocab_size        # drafts outside [0, vocab_size) are cut (they are no tokens)
        self.grammar = grammar
        use_ngram = config is not None and "ngram" in config.drafters
        self.ngram = NGramDrafter(config.ngram, config.max_draft_len) if use_ngram else None
        self.use_forced = config is not None and "forced" in config.drafters
        self.budget: dict[str, int] = {}        # adaptive: lookup tokens per request
        self.user = config.user_drafter if config is not None else None
        self.contexts: dict[str, list[int]] = {}   # prompt + output, kept only for a user drafter
        super().__init__("draft")

    def handlers(self) -> Mapping[type, Handler]:
        return {AddRequest: self.on_add, Release: self.on_release, Forced: self.on_forced,
                TokenEvent: self.on_tokens, Count: self.on_count}

    async def on_add(self, msg: AddRequest) -> None:
        if self.ngram is not None:
            self.ngram.add_request(msg.request_id, msg.prompt)
        if self.user is not None:
            self.contexts[msg.request_id] = list(msg.prompt)

    async def on_release(self, msg: Release) -> None:
        if self.ngram is not None:
            self.ngram.remove(msg.request_id)
        self.budget.pop(msg.request_id, None)
        self.contexts.pop(msg.request_id, None)

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
        if self.user is not None:
            drafts = self._with_user_drafts(plan.snapshots, msg.tokens, drafts, plan.max_draft_len)
        await self.grammar.send(DraftProposal(plan, tuple(drafts)))

    def _with_user_drafts(self, snapshots: tuple[RequestSnapshot, ...], forced: tuple[tuple[int, ...], ...],
                          drafts: list[tuple[int, ...]], k: int) -> list[tuple[int, ...]]:
        """Ask the user drafter for requests the grammar forces nothing on; keep the longer draft."""
        asked = [i for i, s in enumerate(snapshots) if s.sample and not (self.use_forced and forced[i])]
        if not asked:
            return drafts
        proposals = self.user.propose(
            [DraftRequest(snapshots[i].request_id, tuple(self.contexts[snapshots[i].request_id])) for i in asked], k)
        if len(proposals) != len(asked):
            raise ValueError(f"user drafter returned {len(proposals)} proposals for {len(asked)} requests")
        out = list(drafts)
        for i, proposal in zip(asked, proposals):
            ids = [int(t) for t in proposal]
            valid = next((j for j, t in enumerate(ids) if not 0 <= t < self.vocab_size), len(ids))
            out[i] = tuple(combine_drafts([drafts[i], ids[:valid]], k))
        return out

    async def on_tokens(self, event: TokenEvent) -> None:
        for r in event.results:
            if r.request_id in self.contexts:
                self.contexts[r.request_id].extend(r.new_tokens)
        if self.ngram is None:
            return
        k = self.config.max_draft_len if self.config is not None else 0
        for r in event.results:
            self.ngram.extend(r.request_id, r.new_tokens)
            if self.config.adaptive and r.drafted:
                budget = self.budget.get(r.request_id, k)
                self.budget[r.request_id] = min(k, budget + 1) if r.accepted == r.drafted else max(1, r.accepted + 1)
