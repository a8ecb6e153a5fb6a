"""DraftActor: owns the drafters (n-gram pools, a draft model and its KV cache); turns
grammar-forced tokens, lookups and draft-model tokens into each step's drafts.

Per request and step: the forced tokens come first (free drafts), then the n-gram continuation;
when that falls short of the request's k and a draft model is configured, the draft model
continues after the forced tokens instead (its draft is used whatever its length; see _model_drafts). The draft model runs on the
model lane, one token per forward; with draft-side masking, while it computes position j the
GrammarActor fills the mask row after j drafts, and the draft is sampled from masked logits.

Adaptive draft length: each request has a lookup budget k (1..K). A step that accepts every draft
raises it by one; a rejection sets it to accepted + 1. Forced tokens are accepted whatever the
model says, so they never count against it. It changes how much is verified, never what is
emitted: verification is exact for any draft.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import torch

from interlock.actors.base import Actor, Handler
from interlock.drafters.combine import combine_drafts, forced_then_ngram
from interlock.drafters.model import ModelDrafter
from interlock.drafters.ngram import NGramDrafter
from interlock.kernels import apply_token_bitmask_, probs_from_logits
from interlock.kernels.sampling import inverse_cdf, request_generator
from interlock.protocol.messages import (
    AddRequest, Count, DraftMasks, DraftProposal, Forced, Release, RequestSnapshot, TokenEvent,
)
from interlock.protocol.speculative import DraftRequest, SpeculativeConfig
from interlock.protocol.types import RequestId
from interlock.streams.timeline import Timeline

T = TypeVar("T")


class DraftActor(Actor[object]):
    def __init__(self, config: SpeculativeConfig | None, grammar: Actor[object], vocab_size: int, *,
                 model: ModelDrafter | None = None, timeline: Timeline | None = None,
                 bitmask: torch.Tensor | None = None, eos_token_ids: tuple[int, ...] = ()) -> None:
        self.config = config
        self.vocab_size = vocab_size        # drafts outside [0, vocab_size) are cut (they are no tokens)
        self.grammar = grammar
        self.model = model                  # a draft model (its own KV cache), or None
        self.timeline = timeline            # the draft model runs on its model lane
        self.bitmask = bitmask              # the GrammarActor's mask rows, read for draft-side masking
        self.eos = frozenset(eos_token_ids)
        self.generators: dict[RequestId, torch.Generator] = {}    # draft sampling, seeded per request
        self._done = timeline.new_event() if timeline is not None else None
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
        if self.model is not None:
            self.model.add(msg.request_id, msg.prompt)
        if self.user is not None:
            self.contexts[msg.request_id] = list(msg.prompt)

    async def on_release(self, msg: Release) -> None:
        if self.ngram is not None:
            self.ngram.remove(msg.request_id)
        self.budget.pop(msg.request_id, None)
        self.contexts.pop(msg.request_id, None)
        self.generators.pop(msg.request_id, None)
        if self.model is not None:
            self.model.remove(msg.request_id)

    async def on_count(self, msg: Count) -> None:
        ngram = self.ngram.stats().requests if self.ngram is not None else 0
        if self.model is None:
            msg.reply.set_result((ngram, 0, 0, 0))
        else:
            msg.reply.set_result((ngram, len(self.model), self.model.kv.num_free_blocks, self.model.kv.num_blocks))

    async def on_forced(self, msg: Forced) -> None:
        plan = msg.plan
        drafts: list[tuple[int, ...]] = []
        budget: list[int] = []
        for s, forced in zip(plan.snapshots, msg.tokens):
            k = plan.max_draft_len
            if not s.sample or self.config is None:
                drafts.append(())
                budget.append(0)
                continue
            forced = forced if self.use_forced else ()
            if self.config.adaptive:
                k = min(k, len(forced) + self.budget.get(s.request_id, k))
            if self.ngram is not None:
                drafts.append(tuple(forced_then_ngram(forced, self.ngram, s.request_id, k)))
            else:
                drafts.append(tuple(forced[:k]))
            budget.append(k)
        if self.user is not None:
            drafts = self._with_user_drafts(plan.snapshots, msg.tokens, drafts, plan.max_draft_len)
        # The draft model is asked only where the others fall short, and decided before it samples:
        # a stochastic draft is then distributed as its q, which verification needs to be exact.
        probs: list[torch.Tensor | None] = [None] * len(drafts)
        want = {i: k for i, k in enumerate(budget) if self.model is not None and len(drafts[i]) < k}
        if want:
            forced = [f if self.use_forced else () for f in msg.tokens]
            await self._model_drafts(plan.snapshots, forced, want, drafts, probs)
        await self.grammar.send(DraftProposal(plan, tuple(drafts), tuple(probs)))

    # --- the draft model ------------------------------------------------------------------------

    async def _model_drafts(self, snaps: tuple[RequestSnapshot, ...], forced: list[tuple[int, ...]],
                            want: dict[int, int], drafts: list[tuple[int, ...]],
                            probs: list[torch.Tensor | None]) -> None:
        """Continue each wanted request's forced tokens with the draft model up to its k; that replaces
        drafts[i] and sets probs[i], whatever its length: keeping the model's draft only when it came
        out longer would condition it on its own samples, and q would no longer be its law."""
        assert self.model is not None and self.config is not None
        out = {i: list(forced[i][: want[i]]) for i in want}
        q_rows: dict[int, list[torch.Tensor]] = {i: [] for i in want}
        feeds = {i: tuple(out[i]) for i in want if len(out[i]) < want[i]}
        while feeds:
            order = list(feeds)
            logits = await self._on_model_lane(self.model.feed, [(snaps[i].request_id, feeds[i]) for i in order])
            masked = [i for i in order if snaps[i].constrained and self.config.draft_masking]
            if masked:
                ok = await self.grammar.ask(lambda reply: DraftMasks(
                    tuple((snaps[i].slot, tuple(out[i])) for i in masked), reply))
                refused = {i for i, good in zip(masked, ok) if not good}
                rows = torch.tensor([snaps[i].slot * self.rows_per_slot + len(out[i]) for i in order])
                skip = torch.tensor([i not in masked or i in refused for i in order])
                apply_token_bitmask_(logits, self.bitmask, rows=rows, skip=skip, d2t=self.model.lm.d2t,
                                     mask_vocab_size=self.vocab_size)
            feeds = {}
            for row, i in enumerate(order):
                token, q = self._draw(snaps[i], logits[row])
                if token is None:           # the grammar allows nothing more (or refused the prefix)
                    continue
                out[i].append(token)
                if q is not None:
                    q_rows[i].append(q)
                if len(out[i]) < want[i] and token not in self.eos:
                    feeds[i] = (token,)
        for i in want:
            drafts[i] = tuple(out[i])
            probs[i] = self._draft_probs(out[i], q_rows[i]) if q_rows[i] else None

    @property
    def rows_per_slot(self) -> int:
        return self.config.max_draft_len + 1 if self.config is not None else 1

    async def _on_model_lane(self, fn: Callable[..., T], arg: object) -> T:
        """Run fn(arg) on the model lane (after whatever it holds) without blocking the loop."""
        assert self.timeline is not None and self._done is not None
        box: list[T] = []
        self.timeline.model.launch_host(lambda a: box.append(fn(a)), arg)
        self.timeline.model.record(self._done)
        await self._done.wait_async()
        return box[0]

    def _draw(self, s: RequestSnapshot, logits: torch.Tensor) -> tuple[int | None, torch.Tensor | None]:
        """One draft token (a target id) from one row of draft logits; q over the target's vocabulary
        for a sampled request, None for a greedy one (its draft is a point mass)."""
        assert self.model is not None
        d2t = self.model.lm.d2t
        if d2t is None:
            logits = logits[: self.vocab_size]
        else:                               # draft ids that map to no tokenizer id are no tokens
            logits = logits.masked_fill(d2t >= self.vocab_size, float("-inf"))
        if not torch.isfinite(logits).any():
            return None, None
        if s.sampling.greedy:
            token = int(torch.argmax(logits))
            return (token if d2t is None else int(d2t[token])), None
        sp = s.sampling
        q = probs_from_logits(logits[None].float(), torch.tensor([sp.temperature]),
                              torch.tensor([sp.top_k]) if sp.top_k else None,
                              torch.tensor([sp.top_p]) if sp.top_p else None)
        gen = self.generators.get(s.request_id)
        if gen is None:      # its own stream, seeded from the request's seed: same seed, same drafts
            gen = self.generators[s.request_id] = request_generator(sp.seed, salt=0x5EED)
        token = int(inverse_cdf(q, torch.rand(1, generator=gen))[0])
        q_target = torch.zeros(self.vocab_size)
        if d2t is None:
            q_target.copy_(q[0, : self.vocab_size])
            return token, q_target
        keep = d2t < self.vocab_size        # the others have q = 0 (masked above)
        q_target[d2t[keep]] = q[0, keep]
        return int(d2t[token]), q_target

    def _draft_probs(self, out: list[int], q_rows: list[torch.Tensor]) -> torch.Tensor:
        """q [len(out), V]: point masses for the forced head, the model's distributions after it."""
        head = len(out) - len(q_rows)
        q = torch.zeros(len(out), self.vocab_size)
        q[torch.arange(head), torch.tensor(out[:head], dtype=torch.long)] = 1.0
        q[head:] = torch.stack(q_rows)
        return q

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
            if self.model is not None:
                self.model.commit(r.request_id, r.new_tokens)
        if self.config is None:
            return
        k = self.config.max_draft_len
        for r in event.results:
            if self.ngram is not None:
                self.ngram.extend(r.request_id, r.new_tokens)
            if self.config.adaptive and r.drafted:
                budget = self.budget.get(r.request_id, k)
                self.budget[r.request_id] = min(k, budget + 1) if r.accepted == r.drafted else max(1, r.accepted + 1)
