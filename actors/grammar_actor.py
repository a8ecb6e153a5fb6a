"""GrammarActor: one matcher per slot, the host bitmask buffers, and the grammar lane's work.

Per step: on the StepPlan it reads the forced tokens (jump-forward drafts) of every sampling,
constrained request; on the DraftProposal it enqueues the mask fill (K+1 rows per request:
after the last token and after each draft) on the grammar lane and records the mask event,
then hands the proposal to the VerifierActor, whose model lane waits on that event. On the
TokenEvent it advances each matcher by the accepted tokens. Matchers are only ever advanced
by committed tokens: filling the draft rows leaves their state unchanged, so a rejection
needs no rollback.

With a draft model and draft-side masking, the DraftActor asks (DraftMasks) for the row after
each prefix of its drafts while it drafts; the proposal's fill then skips the rows that already
hold the mask of the drafts' own prefixes, so each row is computed once per step.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from interlock.actors.base import Actor, Handler
from interlock.grammars.bitmask import allocate_bitmask
from interlock.protocol.grammar import GrammarBackend, GrammarMatcher
from interlock.protocol.messages import (
    BindGrammar, Count, DraftMasks, DraftProposal, Forced, Release, StepPlan, TokenEvent,
)
from interlock.protocol.types import SlotId
from interlock.streams.timeline import DeviceEvent, Timeline
from interlock.logs import get_logger

log = get_logger(__name__)


@dataclass
class MaskBuffers:
    """Host buffers the grammar lane fills and the model lane reads after the mask event.

    bitmask row slot * (K+1) + j is the mask after j drafts of the request in `slot`;
    rows[slot] is how many of its rows are valid this step (0: no grammar, don't mask).
    """

    bitmask: torch.Tensor      # [max_batch * (K+1), ceil(V/32)] int32
    rows: torch.Tensor         # [max_batch] int32
    rows_per_slot: int         # K + 1

    @classmethod
    def allocate(cls, max_batch: int, max_draft_len: int, vocab_size: int) -> MaskBuffers:
        per = max_draft_len + 1
        return cls(allocate_bitmask(max_batch * per, vocab_size), torch.zeros(max_batch, dtype=torch.int32), per)


class GrammarActor(Actor[object]):
    def __init__(self, backend: GrammarBackend, timeline: Timeline, buffers: MaskBuffers,
                 mask_ready: DeviceEvent, verifier: Actor[object], drafter: Actor[object]) -> None:
        self.backend = backend
        self.timeline = timeline
        self.buffers = buffers
        self.mask_ready = mask_ready
        self.verifier = verifier
        self.drafter = drafter
        self.matchers: dict[SlotId, GrammarMatcher] = {}
        self.prefilled: dict[SlotId, dict[int, tuple[int, ...]]] = {}   # row offset -> prefix it holds
        self._draft_masks_ready = timeline.new_event()
        super().__init__("grammar")

    def handlers(self) -> Mapping[type, Handler]:
        return {BindGrammar: self.on_bind, Release: self.on_release, StepPlan: self.on_plan,
                DraftProposal: self.on_proposal, TokenEvent: self.on_tokens, Count: self.on_count,
                DraftMasks: self.on_draft_masks}

    async def on_bind(self, msg: BindGrammar) -> None:
        self.matchers[msg.slot] = self.backend.matcher(msg.compiled)

    async def on_release(self, msg: Release) -> None:
        self.matchers.pop(msg.slot, None)
        self.prefilled.pop(msg.slot, None)

    async def on_count(self, msg: Count) -> None:
        msg.reply.set_result(len(self.matchers))

    async def on_plan(self, plan: StepPlan) -> None:
        forced = []
        for s in plan.snapshots:
            matcher = self.matchers.get(s.slot) if s.sample and s.constrained else None
            forced.append(tuple(matcher.forced_tokens()[: plan.max_draft_len]) if matcher else ())
        await self.drafter.send(Forced(plan, tuple(forced)))

    async def on_draft_masks(self, msg: DraftMasks) -> None:
        ok: list[bool] = []
        self.timeline.grammar.launch_host(self._fill_draft_rows, (msg.jobs, ok))
        self.timeline.grammar.record(self._draft_masks_ready)
        await self._draft_masks_ready.wait_async()
        msg.reply.set_result(tuple(ok))

    def _fill_draft_rows(self, args: tuple[tuple[tuple[SlotId, tuple[int, ...]], ...], list[bool]]) -> None:
        """Grammar lane: the row after each prefix (advance through it, fill, roll back)."""
        jobs, ok = args
        per = self.buffers.rows_per_slot
        for slot, prefix in jobs:
            matcher = self.matchers[slot]
            if not matcher.accept(prefix):
                ok.append(False)
                continue
            try:
                matcher.fill_mask(self.buffers.bitmask, slot * per + len(prefix))
            finally:
                matcher.rollback(len(prefix))
            self.prefilled.setdefault(slot, {})[len(prefix)] = prefix
            ok.append(True)

    async def on_proposal(self, proposal: DraftProposal) -> None:
        jobs = []
        for s, drafts in zip(proposal.plan.snapshots, proposal.drafts):
            if s.sample and s.constrained:
                held = self.prefilled.pop(s.slot, {})
                skip = frozenset(j for j, prefix in held.items() if drafts[:j] == prefix and j <= len(drafts))
                jobs.append((s.slot, self.matchers[s.slot], drafts, skip))
        if jobs:
            self.timeline.grammar.launch_host(self._fill, jobs)
            self.timeline.grammar.record(self.mask_ready)
        await self.verifier.send(proposal)

    def _fill(self, jobs: list[tuple[SlotId, GrammarMatcher, tuple[int, ...], frozenset[int]]]) -> None:
        """Runs on the grammar lane: K+1 rows per constrained request, one call each."""
        per = self.buffers.rows_per_slot
        self.buffers.rows.zero_()
        for slot, matcher, drafts, skip in jobs:
            self.buffers.rows[slot] = matcher.fill_masks(self.buffers.bitmask, slot * per, drafts, skip)

    async def on_tokens(self, event: TokenEvent) -> None:
        for result in event.results:
            matcher = self.matchers.get(result.slot)
            if matcher is not None and not matcher.accept(result.new_tokens):
                # The tokens were sampled under this matcher's own masks: refusing them is a bug.
                raise RuntimeError(f"grammar refused tokens it allowed: slot {result.slot}, {result.new_tokens}")
