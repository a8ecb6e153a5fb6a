"""DeviceDraftActor: the DraftActor of the device runner when it has a draft model.

The chain (lookups, forced tokens, the user drafter) decides each sampling request's drafts in the
step's prologue, as on the host runner; where it asks the draft model, the request becomes a model
lane of the step's K draft rounds (drafters/device_draft.py), which run inside the captured step.
Per round j (actors/step/program.py lays them out):
- `publish(j)` + the GrammarActor's `fill_draft_rows` + `collect(j)`: ONE host function on the
  grammar lane: each model lane's drafts so far (copied back by round j-1), the grammar's row after
  them, written into the round's contiguous row buffer (a refused prefix gets an empty row, which
  stops the lane);
- `draft_forward(j)` and, after that host function, `draft_sample(j)`: device work.
`finish` (in the fill's host function) hands the final drafts to the grammar; `commit` (in the
step's tail) advances the chain and the draft cache.
"""
from __future__ import annotations

from interlock.actors.draft_actor import DraftActor
from interlock.actors.grammar_actor import MaskBuffers
from interlock.actors.step.program import StepShape
from interlock.actors.step.state import StepState
from interlock.drafters.chain import ChainRequest, DraftChain
from interlock.drafters.device_draft import DeviceDrafter, LaneAsk
from interlock.protocol.messages import Count, StepPlan
from interlock.protocol.speculative import SpeculativeConfig
from interlock.protocol.types import RequestId, TokenId
from interlock.streams.timeline import Timeline


class DeviceDraftActor(DraftActor):
    def __init__(self, config: SpeculativeConfig, vocab_size: int, timeline: Timeline, step: StepState,
                 drafter: DeviceDrafter, buffers: MaskBuffers) -> None:
        super().__init__(config, vocab_size, timeline, step)
        self.chain = DraftChain(config, vocab_size, drafter)      # the model is asked; it keeps its own state
        self.device = drafter
        self.buffers = buffers
        self._asks: list[LaneAsk] = []
        self._heads: dict[int, int] = {}                          # lane -> forced head length (model lanes)

    async def on_count(self, msg: Count) -> None:
        msg.reply.set_result({**self.chain.counts(), **self.device.counts()})

    def _add(self, request_id: RequestId, prompt: tuple[TokenId, ...]) -> None:
        self.chain.add(request_id, prompt)
        self.device.add(request_id, prompt)

    def _remove(self, request_id: RequestId) -> None:
        self.chain.remove(request_id)
        self.device.remove(request_id)

    # --- the prologue ------------------------------------------------------------------------------

    def begin(self, plan: StepPlan) -> None:
        """The chain's drafts; where it asks the model, a model lane of this step's draft rounds."""
        self._plan = plan
        b = self.step
        for s in plan.snapshots:
            b[s.slot].drafts, b[s.slot].probs, b[s.slot].masking = (), None, False
        sampled = [s for s in plan.snapshots if s.sample and s.sampling.speculative and b[s.slot].error is None]
        answers = self.chain.propose([ChainRequest(s.request_id, b[s.slot].forced) for s in sampled])
        asks, heads = [], {}
        masking = self.config is not None and self.config.draft_masking
        for s, answer in zip(sampled, answers):
            if answer.error is not None:
                b.fail(s.slot, answer.error)
                continue
            lane = b[s.slot].lane
            last = s.start + len(s.chunk) - 1       # the position of the lane's token t (a prompt's last)
            # a guided request's companion rows would need the rounds' drafts too: its drafts are
            # the lookups' and the forced tokens (the law is the same, its drafts only shorter)
            if answer.model and s.guide is None:
                head = self.chain.forced(b[s.slot].forced)[: answer.k]
                heads[lane] = len(head)
                asks.append(LaneAsk(lane, s.request_id, s.slot, last, head, answer.k, s.sampling,
                                    masking and s.constrained))
            else:
                b[s.slot].drafts = answer.drafts
                asks.append(LaneAsk(lane, s.request_id, s.slot, last, answer.drafts, 0, s.sampling, False))
        self._asks, self._heads = asks, heads
        rounds = self.device.k if heads else 0
        b.draft_rounds = rounds
        b.draft_q = any(not a.sampling.greedy for a in asks if a.budget)
        b.draft_rows = any(a.masked for a in asks if a.budget)
        if rounds:
            feeds = self.device.stage(asks, len(self.buffers.rows))
            if feeds or self.device.eager_updates:
                self.timeline.model.launch(self.device.catch_up, feeds)     # eager, before the step

    # --- the rounds ------------------------------------------------------------------------------

    def start(self, shape: StepShape) -> None:
        """Device work: the rounds' inputs up (the step's first)."""
        self.device.start(shape.batch, shape.draft_q)

    def draft_forward(self, j: int = 0, shape: StepShape | None = None) -> None:
        assert shape is not None
        self.device.forward(j, shape.batch)

    def draft_sample(self, j: int = 0, shape: StepShape | None = None) -> None:
        assert shape is not None
        self.device.sample(j, shape.batch, greedy=not shape.draft_q)

    def publish(self, j: int) -> None:
        """Host, round j: each model lane that samples this round (past its head, still drafting,
        masked) asks the grammar for the row after its drafts so far."""
        b = self.step
        for a in self._asks:
            slot = b[a.slot]
            slot.masking, slot.refused = False, False
            if not a.masked or j <= self._heads.get(a.lane, 0) or j > a.budget:
                continue
            prefix = self.device.prefix(a.lane, j)
            if prefix is not None:
                slot.prefix, slot.masking = prefix, True

    def collect(self, j: int) -> None:
        """Host, round j: the filled rows into the round's contiguous buffer; a refused prefix gets an
        empty row (nothing allowed: the lane stops)."""
        per = self.buffers.rows_per_slot
        rows, free = self.device.host_rows, self.device.host_free
        for a in self._asks:
            slot = self.step[a.slot]
            if not slot.masking:
                continue
            if slot.refused:
                rows[a.lane].zero_()
                free[a.lane] = False
            else:
                row = a.lane * per + j - 1
                rows[a.lane].copy_(self.buffers.bitmask[row])
                free[a.lane] = self.buffers.free[row]
            slot.masking = False

    def finish(self) -> None:
        """Host, after the rounds: each model lane's drafts, for the grammar's verify rows."""
        if not self.step.draft_rounds:
            return
        for a in self._asks:
            if a.budget:
                self.step[a.slot].drafts = self.device.drafts(a.lane)

    def commit(self) -> None:
        """The step's tail: the chain learns the committed tokens; the draft cache keeps what it fed
        and the target accepted."""
        super().commit()
        b = self.step
        fed = {a.slot: a for a in self._asks} if b.draft_rounds else {}     # lanes the rounds fed
        for s in self._plan.snapshots if self._plan is not None else ():
            r = b[s.slot].result
            if r is None or b[s.slot].error is not None:
                continue
            a = fed.get(s.slot)
            if a is not None:
                self.device.commit_step(a.request_id, a.start, r.new_tokens, r.accepted)
            else:       # a step without rounds: the tokens a later round's catch-up feeds
                self.device.extend(s.request_id, r.new_tokens)
