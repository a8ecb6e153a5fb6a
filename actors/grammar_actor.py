"""GrammarActor: one matcher per slot, the host bitmask buffers, and the grammar lane's part of a step.

Its part of a step (see actors/step/program.py): in the step's prologue, on the event loop, the forced
tokens (jump-forward drafts) of every sampling, constrained request, and the check that cuts
drafts at the first one the grammar refuses; then, as host functions of the step's program, with a
draft model and draft-side masking the mask row after each draft prefix (one per draft
iteration), the K+1 verify rows (after the last token and after each draft), and, once the token
event has fired, advancing each matcher by the committed tokens (or leaving that to the next step,
below). A request's rows are
lane * (K+1) + j (`SlotState.lane`: its place among the step's sampling requests), so a step's
masks are its leading rows. Matchers are only ever advanced by committed tokens: filling rows
advances speculatively and rolls back, so a rejection needs no rollback. A token the matcher
refuses at commit fails that request (GrammarError), not the engine.

The check, the fill and the commit each go through one batched pass over every constrained
request (grammars/batch.py: one batch call per backend, the per-row path for switching grammars).

Where the commit runs. The tail runs with the model lane idle (on a GPU: the GPU idle), and the
next step's forward needs only its input tokens from it, not the matchers, unless the next
prologue reads a matcher: the forced tokens (drafts, so forward rows) where "forced" drafts, and
the host runner's draft check (actors/step/program.py). So the tail advances only those requests'
matchers; every other request's commit is kept pending (`_pending`) and applied by the first part
of the next step that reads its matcher, which is the grammar lane's first host function (the fill,
or a draft model's first mask row), under the next forward (benchmarks/overlap_bench.py measures
it). The matcher is never read before its commit: every reader takes matchers from
`_constrained`, which applies the pending commits of what it returns. A deferred commit that the
matcher refuses fails its request in the next step's outcome instead of this one's (the tokens it
refused have been delivered by then); a request that ends with the step is released with its last
commit unapplied (nothing reads that matcher again; the end-of-request check reads the output).
A release drops the request's pending commit.

Binding and releasing matchers are the Scheduler's calls (`bind`, `release`), not messages: they
carry no decision, and they take effect between steps (`StepState.between_steps`), so a step's
parts and the event loop never touch the matchers at the same time. Matchers (and their pending
commits) are keyed by request id, as every actor keys its per-request state: a slot is reused by
the next request, an id never.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from interlock.actors.framework.base import Actor, Handler
from interlock.actors.step.state import StepState
from interlock.grammars.backends import BackendRouter
from interlock.grammars.batch import Drafted, StepMasks
from interlock.grammars.compiled import CompiledGrammar
from interlock.grammars.bitmask import allocate_bitmask
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import GrammarBackend, GrammarMatcher
from interlock.protocol.messages import Count, RequestSnapshot, StepPlan
from interlock.protocol.types import RequestId, SlotId, TokenId
from interlock.streams.timeline import Timeline
from interlock.logs import get_logger

log = get_logger(__name__)


@dataclass
class MaskBuffers:
    """Host buffers the grammar lane fills and the model lane reads after the mask event.

    bitmask row lane * (K+1) + j is the mask after j drafts of the request in that lane;
    rows[lane] is how many of its rows are valid this step (0: no grammar, don't mask);
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


@dataclass(frozen=True)
class PendingCommit:
    """A request's committed tokens its matcher has not accepted yet (module docstring)."""

    matcher: GrammarMatcher         # the matcher they are for
    tokens: tuple[TokenId, ...]
    request_id: RequestId


class GrammarActor(Actor[object]):
    def __init__(self, backend: GrammarBackend | BackendRouter, timeline: Timeline, buffers: MaskBuffers,
                 step: StepState, mask_threads: int | None = None, batched_masks: bool = True,
                 forced_drafts: bool = True) -> None:
        self.backend = backend
        self.forced_drafts = forced_drafts      # the drafters take forced tokens: the prologue reads matchers
        self.defer_commits = True               # False: every commit in the tail (what overlap_bench compares)
        self.timeline = timeline
        self.buffers = buffers
        self.step = step
        self.matchers: dict[RequestId, GrammarMatcher] = {}              # one per admitted request with a grammar
        # this step's draft-side rows (slot -> row offset -> the prefix it holds): step state, keyed as
        # StepState is, and empty between steps
        self.prefilled: dict[SlotId, dict[int, tuple[TokenId, ...]]] = {}
        self._plan: StepPlan | None = None                                 # the step the lane is in
        self.masks = StepMasks(mask_threads, batched_masks)    # check, fill and commit: one batch pass per backend
        self._pending: dict[RequestId, PendingCommit] = {}      # commits left to the next step (module docstring)
        super().__init__("grammar")

    def handlers(self) -> Mapping[type, Handler]:
        return {Count: self.on_count}

    async def on_count(self, msg: Count) -> None:
        msg.reply.set_result(len(self.matchers))

    # --- the Scheduler's calls (on the loop; they take effect between steps) ----------------------

    def bind(self, request_id: RequestId, compiled: CompiledGrammar) -> None:
        """The request's matcher, from its compiled grammar: there for every step launched after."""
        self.step.between_steps(self._bind, request_id, compiled)

    def release(self, request_id: RequestId) -> None:
        self.step.between_steps(self._release, request_id)

    def _bind(self, request_id: RequestId, compiled: CompiledGrammar) -> None:
        self._pending.pop(request_id, None)
        self.matchers[request_id] = self.backend.matcher(compiled)

    def _release(self, request_id: RequestId) -> None:
        self.matchers.pop(request_id, None)
        self._pending.pop(request_id, None)

    # --- this actor's part of a step ----------------------------------------------------------

    def _constrained(self, reads: Callable[[RequestSnapshot], bool] | None = None
                     ) -> list[tuple[SlotId, int, GrammarMatcher]]:
        """(slot, first mask row, matcher) of each sampling, constrained request still in the step
        (and `reads` it, when given), each matcher advanced by its pending commit first."""
        assert self._plan is not None
        per = self.buffers.rows_per_slot
        out, ids = [], []
        for s in self._plan.snapshots:
            matcher = self.matchers.get(s.request_id) if s.sample and s.constrained else None
            if matcher is not None and self.step[s.slot].error is None and (reads is None or reads(s)):
                out.append((s.slot, self.step[s.slot].lane * per, matcher))
                ids.append((s.slot, s.request_id))
        if self._pending:
            refused = self._settle(ids)
            out = [c for c in out if c[0] not in refused]
        return out

    def _settle(self, requests: list[tuple[SlotId, RequestId]]) -> set[SlotId]:
        """Apply the pending commits of these (slot, request); the slots whose matcher refused them (failed)."""
        due = [(slot, p) for slot, rid in requests if (p := self._pending.pop(rid, None)) is not None
               and self.matchers.get(rid) is p.matcher]
        if not due:
            return set()
        verdicts = self.masks.accept([p.matcher for _, p in due], [p.tokens for _, p in due])
        refused = set()
        for (slot, p), accepted in zip(due, verdicts):
            if not accepted:
                self._refused(slot, p)
                refused.add(slot)
        return refused

    def _refused(self, slot: SlotId, p: PendingCommit) -> None:
        """Fail `slot`'s request in this step: its matcher refused tokens sampled under its own mask."""
        log.error("grammar_refused_committed_tokens", request_id=p.request_id,
                  step=self._plan.step if self._plan else None, tokens=list(p.tokens))
        self.step.fail(slot, GrammarError(f"the grammar refused tokens sampled under its own mask: {p.tokens}"))

    def _wants_forced(self, s: RequestSnapshot) -> bool:
        """Are this request's forced tokens drafted (the only reason to compute them)?"""
        return self.forced_drafts and s.sampling.speculative

    def _commits_now(self, s: RequestSnapshot, checks: bool) -> bool:
        """Does the tail advance this request's matcher: does the next prologue read it (module
        docstring)? For its forced tokens, or for the draft check (`checks`) of its drafts."""
        return not self.defer_commits or self._wants_forced(s) or (checks and s.sampling.speculative)

    def begin(self, plan: StepPlan) -> None:
        """Prologue: the step's plan; each constrained request's forced tokens where they are drafted
        (up to its draft rows)."""
        self._plan = plan
        self.masks.reset()                      # a step that failed midway leaves nothing behind
        self.prefilled.clear()
        b = self.step
        for state in b.slots:
            state.error, state.forced = None, ()
        for s in plan.snapshots:
            if s.sample and s.constrained and s.request_id not in self.matchers:
                b.fail(s.slot, GrammarError(f"request {s.request_id} samples with no matcher bound"))
        for slot, _, matcher in self._constrained(self._wants_forced):
            b[slot].forced = tuple(matcher.forced_tokens()[: plan.max_drafts])

    def fill_draft_rows(self) -> None:
        """One draft-model iteration: the row after each masked request's draft prefix."""
        b = self.step
        for slot, first, matcher in self._constrained():
            if not b[slot].masking:
                continue
            prefix = b[slot].prefix
            if not matcher.accept(prefix):
                b[slot].refused = True
                continue
            try:
                row = first + len(prefix)
                self.buffers.free[row] = bool(matcher.fill_mask(self.buffers.bitmask, row))
            finally:
                matcher.rollback(len(prefix))
            self.prefilled.setdefault(slot, {})[len(prefix)] = prefix

    def check(self) -> None:
        """Cut each constrained request's drafts (and their q) at the first one its grammar refuses:
        it could not be accepted, and the forward would compute it and the rows after it for nothing."""
        b = self.step
        drafted = [(slot, Drafted(matcher, tuple(b[slot].drafts), first))
                   for slot, first, matcher in self._constrained() if b[slot].drafts]
        cuts = self.masks.check([d for _, d in drafted], self.buffers.bitmask)
        for (slot, d), n in zip(drafted, cuts):
            drafts = b[slot].drafts
            if n < len(drafts):
                b[slot].drafts = drafts[:n]
                q = b[slot].probs
                b[slot].probs = q[:n] if q is not None else None

    def fill(self) -> None:
        """K+1 rows per constrained request (rows already filled while drafting are reused)."""
        self.buffers.rows.zero_()
        lanes, drafted = [], []
        for slot, first, matcher in self._constrained():
            drafts = tuple(self.step[slot].drafts)
            held = self.prefilled.pop(slot, {})
            skip = frozenset(j for j, prefix in held.items() if j <= len(drafts) and drafts[:j] == tuple(prefix))
            lanes.append(self.step[slot].lane)
            drafted.append(Drafted(matcher, drafts, first, skip))
        for lane, n in zip(lanes, self.masks.fill(drafted, self.buffers.bitmask, free=self.buffers.free)):
            self.buffers.rows[lane] = n
        self.prefilled.clear()

    def commit(self, prologue_checks: bool = False) -> None:
        """After the token event: advance the matchers the next prologue reads by their requests'
        committed tokens (`prologue_checks`: it runs the draft check); keep the others' pending."""
        assert self._plan is not None
        b, snapshots = self.step, {s.slot: s for s in self._plan.snapshots}
        now: list[tuple[SlotId, PendingCommit]] = []
        for slot, _, matcher in self._constrained():
            r = b[slot].result
            if r is None:
                continue
            p = PendingCommit(matcher, tuple(r.new_tokens), r.request_id)
            if self._commits_now(snapshots[slot], prologue_checks):
                now.append((slot, p))
            else:
                self._pending[r.request_id] = p
        verdicts = self.masks.commit([p.matcher for _, p in now], [p.tokens for _, p in now])
        for (slot, p), accepted in zip(now, verdicts):
            if not accepted:
                self._refused(slot, p)
