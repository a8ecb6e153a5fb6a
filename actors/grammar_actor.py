"""GrammarActor: one matcher per slot, the host bitmask buffers, and the grammar lane's part of a step.

Its part of a step (see actors/step.py) runs as host functions on the grammar lane, reading the
step's plan from its own StepQueue: the forced tokens (jump-forward drafts) of every sampling,
constrained request; with a draft model and draft-side masking, the mask row after each draft
prefix, one per draft iteration; the K+1 verify rows (after the last token and after each draft);
and, once the token event has fired, advancing each matcher by the committed tokens. Matchers
are only ever advanced by committed tokens: filling rows advances speculatively and rolls back,
so a rejection needs no rollback. A token the matcher refuses at commit fails that request
(GrammarError), not the engine.

The check, the fill and the commit each go through one batched pass over every constrained
request (grammars/batch.py: one batch call per backend, the per-row path for switching grammars).

Binding and releasing matchers are grammar-lane host functions too, so the matchers are only
ever touched by the lane thread, in lane order.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from interlock.actors.base import Actor, Handler
from interlock.actors.step import StepState, StepQueue
from interlock.grammars.batch import Drafted, StepMasks
from interlock.grammars.bitmask import allocate_bitmask
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import GrammarBackend, GrammarMatcher
from interlock.protocol.messages import BindGrammar, Count, Release, StepPlan
from interlock.protocol.types import SlotId, TokenId
from interlock.streams.timeline import Timeline
from interlock.logs import get_logger

log = get_logger(__name__)


@dataclass
class MaskBuffers:
    """Host buffers the grammar lane fills and the model lane reads after the mask event.

    bitmask row slot * (K+1) + j is the mask after j drafts of the request in `slot`;
    rows[slot] is how many of its rows are valid this step (0: no grammar, don't mask);
    free[row] is True where the grammar is free at that row (a switching grammar outside its
    constrained part): the row is left unwritten and readers skip it instead of applying it.
    """

    bitmask: torch.Tensor      # [max_batch * (D+1), ceil(V/32)] int32; D = draft rows per request (step_drafts)
    rows: torch.Tensor         # [max_batch] int32
    rows_per_slot: int         # D + 1
    free: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.bool))  # [max_batch * (D+1)]

    @classmethod
    def allocate(cls, max_batch: int, max_drafts: int, vocab_size: int) -> MaskBuffers:
        per = max_drafts + 1
        return cls(allocate_bitmask(max_batch * per, vocab_size), torch.zeros(max_batch, dtype=torch.int32), per,
                   torch.zeros(max_batch * per, dtype=torch.bool))


class GrammarActor(Actor[object]):
    def __init__(self, backend: GrammarBackend, timeline: Timeline, buffers: MaskBuffers,
                 step: StepState, mask_threads: int | None = None, batched_masks: bool = True) -> None:
        self.backend = backend
        self.timeline = timeline
        self.buffers = buffers
        self.step = step
        self.queue = StepQueue("grammar")
        self.matchers: dict[SlotId, GrammarMatcher] = {}                 # grammar lane only
        self.prefilled: dict[SlotId, dict[int, tuple[TokenId, ...]]] = {}  # row offset -> prefix it holds
        self._plan: StepPlan | None = None                                 # the step the lane is in
        self.masks = StepMasks(mask_threads, batched_masks)    # check, fill and commit: one batch pass per backend
        super().__init__("grammar")

    def handlers(self) -> Mapping[type, Handler]:
        return {BindGrammar: self.on_bind, Release: self.on_release, Count: self.on_count}

    async def on_bind(self, msg: BindGrammar) -> None:
        self.timeline.grammar.launch_host(self._bind, msg.slot, msg.compiled)
        if msg.reply is not None:
            msg.reply.set_result(None)

    async def on_release(self, msg: Release) -> None:
        self.timeline.grammar.launch_host(self._release, msg.slot)

    async def on_count(self, msg: Count) -> None:
        await self.timeline.grammar.synchronize()
        msg.reply.set_result(len(self.matchers))

    def _bind(self, slot: SlotId, compiled: object) -> None:
        self.matchers[slot] = self.backend.matcher(compiled)

    def _release(self, slot: SlotId) -> None:
        self.matchers.pop(slot, None)
        self.prefilled.pop(slot, None)

    # --- grammar lane: this actor's part of a step ----------------------------------------------

    def _constrained(self) -> list[tuple[SlotId, GrammarMatcher]]:
        assert self._plan is not None
        out = []
        for s in self._plan.snapshots:
            matcher = self.matchers.get(s.slot) if s.sample and s.constrained else None
            if matcher is not None and self.step[s.slot].error is None:
                out.append((s.slot, matcher))
        return out

    def begin(self) -> None:
        """Take the step's plan; write each constrained request's forced tokens (up to its draft rows)."""
        plan = self._plan = self.queue.take()
        self.masks.reset()                      # a step that failed midway leaves nothing behind
        b = self.step
        for state in b.slots:
            state.error, state.forced = None, ()
        for s in plan.snapshots:
            if s.sample and s.constrained and s.slot not in self.matchers:
                b.fail(s.slot, GrammarError(f"request {s.request_id} samples with no matcher bound"))
        for slot, matcher in self._constrained():
            b[slot].forced = tuple(matcher.forced_tokens()[: plan.max_drafts])

    def fill_draft_rows(self) -> None:
        """One draft-model iteration: the row after each masked request's draft prefix."""
        per = self.buffers.rows_per_slot
        b = self.step
        for slot, matcher in self._constrained():
            if not b[slot].masking:
                continue
            prefix = b[slot].prefix
            if not matcher.accept(prefix):
                b[slot].refused = True
                continue
            try:
                row = slot * per + len(prefix)
                self.buffers.free[row] = bool(matcher.fill_mask(self.buffers.bitmask, row))
            finally:
                matcher.rollback(len(prefix))
            self.prefilled.setdefault(slot, {})[len(prefix)] = prefix

    def check(self) -> None:
        """Cut each constrained request's drafts (and their q) at the first one its grammar refuses:
        it could not be accepted, and the forward would compute it and the rows after it for nothing."""
        b = self.step
        per = self.buffers.rows_per_slot
        drafted = [(slot, Drafted(matcher, tuple(b[slot].drafts), slot * per))
                   for slot, matcher in self._constrained() if b[slot].drafts]
        cuts = self.masks.check([d for _, d in drafted], self.buffers.bitmask)
        for (slot, d), n in zip(drafted, cuts):
            drafts = b[slot].drafts
            if n < len(drafts):
                b[slot].drafts = drafts[:n]
                q = b[slot].probs
                b[slot].probs = q[:n] if q is not None else None

    def fill(self) -> None:
        """K+1 rows per constrained request (rows already filled while drafting are reused)."""
        per = self.buffers.rows_per_slot
        self.buffers.rows.zero_()
        slots, drafted = [], []
        for slot, matcher in self._constrained():
            drafts = tuple(self.step[slot].drafts)
            held = self.prefilled.pop(slot, {})
            skip = frozenset(j for j, prefix in held.items() if j <= len(drafts) and drafts[:j] == tuple(prefix))
            slots.append(slot)
            drafted.append(Drafted(matcher, drafts, slot * per, skip))
        for slot, n in zip(slots, self.masks.fill(drafted, self.buffers.bitmask, free=self.buffers.free)):
            self.buffers.rows[slot] = n
        self.prefilled.clear()

    def commit(self) -> None:
        """After the token event: advance each matcher by its request's committed tokens."""
        b = self.step
        done = [(slot, matcher, b[slot].result) for slot, matcher in self._constrained()
                if b[slot].result is not None]
        verdicts = self.masks.commit([m for _, m, _ in done], [r.new_tokens for _, _, r in done])
        for (slot, _, result), accepted in zip(done, verdicts):
            if accepted:
                continue
            error = GrammarError(f"the grammar refused tokens sampled under its own mask: {result.new_tokens}")
            log.error("grammar_refused_committed_tokens", request_id=result.request_id,
                      step=self._plan.step if self._plan else None, tokens=list(result.new_tokens))
            b.fail(slot, error)
