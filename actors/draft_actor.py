"""DraftActor: owns the drafters (the DraftChain: forced, n-gram, suffix, user, and the draft model
with its KV cache and per-request draft generators) and the model lane's drafting part of a step.

Its part of a step (see actors/step/program.py): in the prologue, `begin` asks the chain for each sampling
request's drafts (after the grammar wrote its forced tokens) and starts the draft model's rounds
where the chain says so; with a draft model, on the model lane, K iterations of `draft_forward`
(one token per forward for every request still drafting) and `draft_sample` (after the grammar
lane filled the draft-side mask row: mask, then draw); `finish` writes the drafts and their q for
the grammar and the verifier; `commit`, in the step's tail, feeds the committed tokens back to
the chain.

What drafts are made is decided in drafters/ (the chain and DraftRounds); this actor only places
those decisions on the lane and the step buffers, and applies the draft-side mask rows.

Adding and removing a request are the Scheduler's calls (`add`, `release`), not messages; they take
effect between steps (`StepState.between_steps`), so a step's parts and the event loop never touch
the drafters at the same time. Every drafter keys its per-request state by request id.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from interlock.actors.framework.base import Actor, Handler
from interlock.actors.step.program import StepShape
from interlock.actors.step.state import StepState
from interlock.drafters.chain import ChainRequest, DraftChain
from interlock.drafters.model import DraftRounds, ModelAsk, ModelDrafter
from interlock.kernels import apply_token_bitmask_
from interlock.protocol.messages import Count, StepPlan
from interlock.protocol.speculative import SpeculativeConfig
from interlock.protocol.types import RequestId, TokenId
from interlock.streams.timeline import Timeline


class DraftActor(Actor[object]):
    def __init__(self, config: SpeculativeConfig | None, vocab_size: int, timeline: Timeline, step: StepState,
                 *, model: ModelDrafter | None = None, bitmask: torch.Tensor | None = None,
                 free_rows: torch.Tensor | None = None) -> None:
        self.config = config
        self.vocab_size = vocab_size
        self.timeline = timeline
        self.step = step
        self.chain = DraftChain(config, vocab_size, model)
        self.model = model                  # a draft model (its own KV cache), or None
        self.bitmask = bitmask              # the GrammarActor's mask rows, read for draft-side masking
        self.free_rows = free_rows          # its per-row "grammar free here" flags: such rows are skipped
        self._plan: StepPlan | None = None
        self._rounds: DraftRounds | None = None
        self._constrained: set[int] = set()     # this step's slots with a grammar (draft-side masking)
        super().__init__("draft")

    def handlers(self) -> Mapping[type, Handler]:
        return {Count: self.on_count}

    async def on_count(self, msg: Count) -> None:
        msg.reply.set_result(self.chain.counts())

    # --- the Scheduler's calls (on the loop; they take effect between steps) ----------------------

    def add(self, request_id: RequestId, prompt: tuple[TokenId, ...]) -> None:
        """Start indexing an admitted request's prompt: every drafter has it for the next step."""
        self.step.between_steps(self._add, request_id, prompt)

    def release(self, request_id: RequestId) -> None:
        self.step.between_steps(self._remove, request_id)

    def _add(self, request_id: RequestId, prompt: tuple[TokenId, ...]) -> None:
        self.chain.add(request_id, prompt)

    def _remove(self, request_id: RequestId) -> None:
        self.chain.remove(request_id)

    @property
    def rows_per_slot(self) -> int:
        return self.config.step_drafts + 1 if self.config is not None else 1

    # --- this actor's part of a step ----------------------------------------------------------

    def begin(self, plan: StepPlan) -> None:
        """Prologue: the chain's drafts; the draft model's rounds where the chain asks."""
        self._plan = plan
        b = self.step
        # sampling.speculative False: no drafts of any kind for that request (its neighbours draft on)
        sampled = [s for s in plan.snapshots if s.sample and s.sampling.speculative and b[s.slot].error is None]
        for s in plan.snapshots:
            b[s.slot].drafts, b[s.slot].probs, b[s.slot].masking = (), None, False
        answers = self.chain.propose([ChainRequest(s.request_id, b[s.slot].forced) for s in sampled])
        asks: dict[int, ModelAsk] = {}
        for s, answer in zip(sampled, answers):
            if answer.error is not None:
                b.fail(s.slot, answer.error)
                continue
            b[s.slot].drafts = answer.drafts
            if answer.model:
                head = self.chain.forced(b[s.slot].forced)[: answer.k]
                asks[s.slot] = ModelAsk(s.request_id, head, answer.k, s.sampling)
        self._rounds = DraftRounds(self.model, asks, self.vocab_size) if asks and self.model is not None else None
        self._constrained = {s.slot for s in sampled if s.constrained}

    def draft_forward(self, j: int = 0, shape: StepShape | None = None) -> None:
        """One draft-model forward for every request still drafting; publishes each one's prefix
        for the grammar lane's draft-side mask row. j, shape: the device rounds' (DeviceDraftActor);
        here the host's DraftRounds keeps its own round and sizes."""
        b, rounds = self.step, self._rounds
        if rounds is None:
            return
        for slot in rounds.order:
            b[slot].masking = False
        masking = self.config is not None and self.config.draft_masking
        for slot in rounds.forward():
            b[slot].prefix = tuple(rounds.out[slot])
            b[slot].refused = False
            b[slot].masking = masking and slot in self._constrained

    def draft_sample(self, j: int = 0, shape: StepShape | None = None) -> None:
        """After the draft mask row: mask the draft logits and draw one draft per request (j, shape:
        as draft_forward's)."""
        b, rounds = self.step, self._rounds
        if rounds is None or rounds.logits is None:
            return
        if any(b[slot].masking for slot in rounds.order):
            assert self.bitmask is not None and self.model is not None
            order = rounds.order
            rows = torch.tensor([b[slot].lane * self.rows_per_slot + len(rounds.out[slot]) for slot in order])
            skip = torch.tensor([not b[slot].masking or b[slot].refused for slot in order])
            if self.free_rows is not None:
                skip |= self.free_rows[rows]
            apply_token_bitmask_(rounds.logits, self.bitmask, rows=rows, skip=skip, d2t=self.model.lm.d2t,
                                 mask_vocab_size=self.vocab_size)
        rounds.sample()

    def finish(self) -> None:
        """The draft model's drafts (and q) replace the chain's where it drafted."""
        b, rounds = self.step, self._rounds
        if rounds is not None:
            for slot in rounds.order:
                b[slot].masking = False
            for slot in rounds.asks:
                b[slot].drafts, b[slot].probs = rounds.result(slot)
        self._rounds = None

    def commit(self) -> None:
        """After the token event: every drafter learns the committed tokens."""
        assert self._plan is not None
        b = self.step
        for s in self._plan.snapshots:
            r = b[s.slot].result
            if not s.sample or r is None or b[s.slot].error is not None:
                continue
            self.chain.commit(r.request_id, r.new_tokens, r.drafted, r.accepted)
