"""DraftActor: owns the drafters (the DraftChain: forced, n-gram, user; a draft model and its KV
cache; per-request draft generators) and the model lane's drafting part of a step.

Its part of a step (see actors/step.py) runs on the model lane, reading the step's plan from its
own StepQueue: `begin` asks the chain for each sampling request's drafts (after the grammar lane
wrote its forced tokens); with a draft model, K iterations of `draft_forward` (one token per
forward for every request still drafting) and `draft_sample` (after the grammar lane filled the
draft-side mask row: mask, then draw); `finish` writes the drafts and their q for the grammar lane
and the verifier; `commit`, after the token event, feeds the committed tokens back to every drafter.

The draft model continues the forced tokens of the requests whose chain draft falls short of
their budget, and its draft is used whatever its length: keeping it only when it came out longer
would condition it on its own samples, and q would no longer be its law. The decision is made
before it samples.

Adding and removing a request are model-lane host functions too: the drafters' state is only
ever touched by the lane thread, in lane order.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from interlock.actors.base import Actor, Handler
from interlock.actors.step import StepBuffers, StepQueue
from interlock.drafters.chain import ChainRequest, DraftChain
from interlock.drafters.model import ModelDrafter
from interlock.kernels import apply_token_bitmask_
from interlock.kernels.sampling import draw_draft, request_generator
from interlock.protocol.messages import AddRequest, Count, Release, RequestSnapshot, StepPlan
from interlock.protocol.speculative import SpeculativeConfig
from interlock.protocol.types import RequestId, SlotId, TokenId
from interlock.streams.timeline import Timeline
from interlock.logs import get_logger

log = get_logger(__name__)


@dataclass
class _Drafting:
    """The draft model's loop state for one step (model lane only)."""

    snaps: dict[SlotId, RequestSnapshot]
    want: dict[SlotId, int]                                   # budget k of each request it drafts for
    out: dict[SlotId, list[TokenId]]
    q_rows: dict[SlotId, list[torch.Tensor]]
    feeds: dict[SlotId, tuple[TokenId, ...]]                  # what the next forward feeds
    order: list[SlotId] = field(default_factory=list)         # rows of `logits`
    logits: torch.Tensor | None = None


class DraftActor(Actor[object]):
    def __init__(self, config: SpeculativeConfig | None, vocab_size: int, timeline: Timeline, step: StepBuffers,
                 *, model: ModelDrafter | None = None, bitmask: torch.Tensor | None = None,
                 free_rows: torch.Tensor | None = None, eos_token_ids: tuple[int, ...] = ()) -> None:
        self.config = config
        self.vocab_size = vocab_size
        self.timeline = timeline
        self.step = step
        self.chain = DraftChain(config, vocab_size)
        self.model = model                  # a draft model (its own KV cache), or None
        self.bitmask = bitmask              # the GrammarActor's mask rows, read for draft-side masking
        self.free_rows = free_rows          # its per-row "grammar free here" flags: such rows are skipped
        self.eos = frozenset(eos_token_ids)
        self.generators: dict[RequestId, torch.Generator] = {}    # draft sampling, seeded per request
        self.queue = StepQueue("draft")
        self._plan: StepPlan | None = None
        self._drafting: _Drafting | None = None
        super().__init__("draft")

    def handlers(self) -> Mapping[type, Handler]:
        return {AddRequest: self.on_add, Release: self.on_release, Count: self.on_count}

    async def on_add(self, msg: AddRequest) -> None:
        self.timeline.model.launch_host(self._add, msg.request_id, msg.prompt)
        if msg.reply is not None:
            msg.reply.set_result(None)

    async def on_release(self, msg: Release) -> None:
        self.timeline.model.launch_host(self._remove, msg.request_id)

    async def on_count(self, msg: Count) -> None:
        await self.timeline.model.synchronize()
        counts = self.chain.counts()
        counts["draft_generators"] = len(self.generators)
        if self.model is None:
            counts.update(draft_requests=0, draft_kv_free_blocks=0, draft_kv_total_blocks=0)
        else:
            counts.update(draft_requests=len(self.model), draft_kv_free_blocks=self.model.kv.num_free_blocks,
                          draft_kv_total_blocks=self.model.kv.num_blocks)
        msg.reply.set_result(counts)

    def _add(self, request_id: RequestId, prompt: tuple[TokenId, ...]) -> None:
        self.chain.add(request_id, prompt)
        if self.model is not None:
            self.model.add(request_id, prompt)

    def _remove(self, request_id: RequestId) -> None:
        self.chain.remove(request_id)
        self.generators.pop(request_id, None)
        if self.model is not None:
            self.model.remove(request_id)

    @property
    def rows_per_slot(self) -> int:
        return self.config.max_draft_len + 1 if self.config is not None else 1

    # --- model lane: this actor's part of a step -----------------------------------------------

    def begin(self) -> None:
        """Take the step's plan; the chain's drafts; which requests the draft model continues."""
        plan = self._plan = self.queue.take()
        b = self.step
        sampled = [s for s in plan.snapshots if s.sample and b.errors[s.slot] is None]
        for s in plan.snapshots:
            b.drafts[s.slot], b.probs[s.slot], b.masking[s.slot] = (), None, False
        answers = self.chain.propose([ChainRequest(s.request_id, b.forced[s.slot]) for s in sampled])
        drafting = _Drafting({}, {}, {}, {}, {})
        for s, answer in zip(sampled, answers):
            if answer.error is not None:
                b.fail(s.slot, answer.error)
                continue
            b.drafts[s.slot] = answer.drafts
            if self.model is not None and len(answer.drafts) < answer.k:
                drafting.snaps[s.slot] = s
                drafting.want[s.slot] = answer.k
                drafting.out[s.slot] = list(self.chain.forced(b.forced[s.slot])[: answer.k])
                drafting.q_rows[s.slot] = []
                if len(drafting.out[s.slot]) < answer.k:
                    drafting.feeds[s.slot] = tuple(drafting.out[s.slot])
        self._drafting = drafting

    def draft_forward(self) -> None:
        """One draft-model forward for every request still drafting; publishes each one's prefix."""
        d, b = self._drafting, self.step
        assert d is not None and self.model is not None and self.config is not None
        for slot in d.order:
            b.masking[slot] = False
        d.order, d.logits = list(d.feeds), None
        if not d.order:
            return
        d.logits = self.model.feed([(d.snaps[slot].request_id, d.feeds[slot]) for slot in d.order])
        for slot in d.order:
            b.prefix[slot] = tuple(d.out[slot])
            b.refused[slot] = False
            b.masking[slot] = d.snaps[slot].constrained and self.config.draft_masking

    def draft_sample(self) -> None:
        """After the draft mask row: mask the draft logits and draw one draft per request."""
        d, b = self._drafting, self.step
        assert d is not None and self.model is not None
        if d.logits is None:
            return
        logits = d.logits
        if any(b.masking[slot] for slot in d.order):
            assert self.bitmask is not None
            rows = torch.tensor([slot * self.rows_per_slot + len(d.out[slot]) for slot in d.order])
            skip = torch.tensor([not b.masking[slot] or b.refused[slot] for slot in d.order])
            if self.free_rows is not None:
                skip |= self.free_rows[rows]
            apply_token_bitmask_(logits, self.bitmask, rows=rows, skip=skip, d2t=self.model.lm.d2t,
                                 mask_vocab_size=self.vocab_size)
        d.feeds = {}
        for row, slot in enumerate(d.order):
            s = d.snaps[slot]
            gen = None
            if not s.sampling.greedy:   # its own stream, seeded from the request's seed: same seed, same drafts
                gen = self.generators.get(s.request_id)
                if gen is None:
                    gen = self.generators[s.request_id] = request_generator(s.sampling.seed, salt=0x5EED)
            token, q = draw_draft(logits[row], s.sampling, gen, self.vocab_size, self.model.lm.d2t)
            if token is None:           # the grammar allows nothing more (or refused the prefix)
                continue
            d.out[slot].append(token)
            if q is not None:
                d.q_rows[slot].append(q)
            if len(d.out[slot]) < d.want[slot] and token not in self.eos:
                d.feeds[slot] = (token,)

    def finish(self) -> None:
        """The draft model's drafts (and q) replace the chain's where it drafted."""
        d, b = self._drafting, self.step
        assert d is not None
        for slot in d.order:
            b.masking[slot] = False
        for slot, out in d.out.items():
            b.drafts[slot] = tuple(out)
            b.probs[slot] = self._draft_probs(out, d.q_rows[slot]) if d.q_rows[slot] else None
        self._drafting = None

    def commit(self) -> None:
        """After the token event: every drafter learns the committed tokens."""
        assert self._plan is not None
        b = self.step
        for s in self._plan.snapshots:
            r = b.results[s.slot]
            if not s.sample or r is None or b.errors[s.slot] is not None:
                continue
            self.chain.commit(r.request_id, r.new_tokens, r.drafted, r.accepted)
            if self.model is not None:
                self.model.commit(r.request_id, r.new_tokens)

    def _draft_probs(self, out: list[int], q_rows: list[torch.Tensor]) -> torch.Tensor:
        """q [len(out), V]: point masses for the forced head, the model's distributions after it."""
        head = len(out) - len(q_rows)
        q = torch.zeros(len(out), self.vocab_size)
        q[torch.arange(head), torch.tensor(out[:head], dtype=torch.long)] = 1.0
        q[head:] = torch.stack(q_rows)
        return q
