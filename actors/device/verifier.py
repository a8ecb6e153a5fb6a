"""DeviceVerifier: the VerifierActor of the device runner, whose step is fixed-shape tensor work.

Its part of a step (actors/step/program.py), for a step of shape `StepShape` (rows, batch, mode, updates):
- `begin` + `stage`, in the prologue on the event loop: every row's token, position, KV slot and
  block-table row, the logits rows (each sampling request's K+1 verify rows, nothing for prompt
  chunks), the block-table entries that changed, and every verified request's drafts, sampling
  parameters and uniforms, written into the host staging buffers (actors/device/staging.py);
- `forward` (device work): copy them up, scatter the table updates, run the target forward
  (models/device_llama.py) for the logits rows;
- after the mask event, `verify` (device work): copy the step's lanes' masks, mask and verify
  (kernels/verify.py), copy the results back;
- `finish` (in the step's tail host function): each request's SlotResult from the copied results.

Device work reads nothing but those persistent buffers and the shape it is called with: its Python
runs when it is enqueued (or captured), its kernels when the lane reaches them, and a replay runs
the kernels alone. A step whose requests all decode (one token and K draft rows each) is laid out
in a padded bucket of B requests x (K+1) rows, with room for 2 table updates per request: the same
shape step after step, which the StepProgram captures. Other steps (prompt chunks, or more table
updates) are laid out densely and run eagerly.

Verified request b is the step's lane b (`SlotState.lane`), so its grammar rows are the masks'
leading rows. Per-request features (actors/device/feature_staging.py) change the shape only where a step
uses them: a guided request's companion sequence is fed in the same forward, its K+1 rows after
all the requests' (companion g of a bucket at rows (B+g)*(K+1)), with its own block-table row
(slot S + s); penalties and logprobs add device work to `verify` (kernels/verify_features.py).
A draft model's rounds (actors/device/draft_actor.py) draw the drafts on the device: `forward`
copies them into the lanes' draft rows and `verify` reads them, their count and their law from the
drafter. A guided request drafts without the model (lookups and forced tokens only), since its
companion's rows would need the rounds' drafts too.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from interlock.actors.device.feature_staging import FeatureStaging, feature_shape
from interlock.actors.grammar_actor import MaskBuffers
from interlock.actors.step.planner import guided_rows
from interlock.actors.device.staging import StepStaging
from interlock.actors.step.program import StepShape
from interlock.actors.step.state import StepState
from interlock.actors.verifier_actor import VerifierActor
from interlock.drafters.device_draft import DeviceDrafter
from interlock.kernels.penalty_book import PenaltyBook
from interlock.kernels.verify import sampling_mode
from interlock.kernels.verify_features import verify_features
from interlock.models.device_llama import DeviceLlama
from interlock.models.kv_cache import PagedKVCache, slots_of
from interlock.protocol.messages import RequestSnapshot, StepPlan
from interlock.streams.timeline import Timeline

UPDATES_PER_REQUEST = 2     # table entries a decode step may write per request (K+1 <= block size)


def step_shape(plan: StepPlan, buckets: tuple[int, ...], updates: int, state: StepState | None = None) -> StepShape:
    """The step's shape: a bucket when every request decodes one token (plus drafts) and its table
    updates fit the bucket's room (its companions' included), else dense rows; with the draft
    rounds the prologue staged (`state`)."""
    rounds, draft_q, draft_rows = 0, False, False                   # StepShape's: no draft rounds
    if state is not None and state.draft_rounds:
        rounds, draft_q, draft_rows = state.draft_rounds, state.draft_q, state.draft_rows
    snaps = plan.snapshots
    k = plan.max_drafts
    sampled = [s for s in snaps if s.sample]
    mode = sampling_mode([s.sampling for s in sampled])

    def bucket(n: int) -> int:
        return next(b for b in buckets if b >= n)

    if snaps and len(snaps) <= buckets[-1] and all(s.sample and len(s.chunk) == 1 for s in snaps):
        features = feature_shape(sampled, bucket)
        sets = bucket(len(snaps)) + features.guides          # row sets: requests, then companions
        if updates <= sets * UPDATES_PER_REQUEST:
            return StepShape(sets * (k + 1), bucket(len(snaps)), mode, graph=True,
                             updates=sets * UPDATES_PER_REQUEST, features=features, rounds=rounds,
                             draft_q=draft_q, draft_rows=draft_rows)
    rows = sum(len(s.chunk) + (len(s.guide.chunk) if s.guide is not None else 0)
               + (k * (1 + (s.guide is not None)) if s.sample else 0) for s in snaps)
    return StepShape(rows, len(sampled), mode, graph=False, updates=updates, features=feature_shape(sampled, None),
                     rounds=rounds, draft_q=draft_q, draft_rows=draft_rows)


@dataclass
class _Work:
    plan: StepPlan
    shape: StepShape
    verified: list[tuple[int, RequestSnapshot]]       # (lane, request) of the requests verified
    companions: dict[int, int]                          # guided lane -> its companion's row set


class DeviceVerifier(VerifierActor):
    # every sampling request has K draft rows whatever its drafts: the grammar's cut is left to the
    # fill, under the forward, and verification reads it from the rows filled (actors/step/program.py)
    fixed_rows = True

    def __init__(self, model: DeviceLlama, kv: PagedKVCache, timeline: Timeline, buffers: MaskBuffers,
                 step: StepState, tokenizer_vocab: int, eos_token_ids: tuple[int, ...], *, max_rows: int,
                 max_drafts: int, buckets: tuple[int, ...], max_blocks: int, pad_block: int,
                 drafter: DeviceDrafter | None = None) -> None:
        super().__init__(model, kv, timeline, buffers, step, tokenizer_vocab, eos_token_ids,  # type: ignore[arg-type]
                         lean=False)
        self.buckets = buckets
        self.k = max_drafts
        self.pad_slot = pad_block * kv.block_size       # padding rows write K/V there (a block outside the pool)
        slots = len(step)
        tables = 2 * slots                  # a table row per slot, and one per slot's CFG companion
        rows = max(max_rows, guided_rows(buckets[-1], max_drafts))
        # a step writes at most every table whole (a prefix-cache hit), or 2 entries per row set
        updates = max(tables * max_blocks, 2 * buckets[-1] * UPDATES_PER_REQUEST)
        batch = max(slots, buckets[-1])
        self.staging = StepStaging(rows=rows, batch=batch, k=max_drafts, slots=tables, max_blocks=max_blocks,
                                   updates=updates, pad_block=pad_block, device=model.device,
                                   bitmask=buffers.bitmask, rows_filled=buffers.rows, free=buffers.free,
                                   companions=batch)
        self.penalties = PenaltyBook(slots, model.config.vocab_size, model.device, timeline.model.launch)
        self.features = FeatureStaging(batch=batch, k=max_drafts, device=model.device, penalties=self.penalties)
        self.drafter = drafter            # a draft model's rounds write the lanes' drafts on the device
        self._logits: torch.Tensor | None = None
        self._dwork: _Work | None = None

    def shape_of(self, plan: StepPlan) -> StepShape:
        """The shape `stage` laid this step out in."""
        assert self._dwork is not None and self._dwork.plan is plan, "stage() before shape_of()"
        return self._dwork.shape

    # --- the prologue (event loop) -------------------------------------------------------------

    def stage(self) -> None:
        """Lay the step out in the host staging buffers (module docstring)."""
        plan = self._plan
        assert plan is not None and plan.kv is not None
        b, st = self.step, self.staging
        updates: list[tuple[int, int]] = []
        tables: dict[int, tuple[int, ...]] = {}         # table row -> its sequence's blocks
        for s in plan.snapshots:
            b[s.slot].result = None
            for row, seq in ((s.slot, s.seq), (len(b) + s.slot, s.guide.seq if s.guide is not None else None)):
                if seq is not None:
                    tables[row] = plan.kv.block_table(seq)
                    st.mirror.updates(row, seq, tables[row], updates)
        shape = step_shape(plan, self.buckets, len(updates), b)
        verified = [(b[s.slot].lane, s) for s in plan.snapshots if s.sample and b[s.slot].error is None]
        guided = sorted(b[s.slot].lane for s in plan.snapshots if s.sample and s.guide is not None)
        companions = {lane: g for g, lane in enumerate(guided)}
        self._stage_rows(plan, shape, tables, companions)
        self._stage_updates(updates, shape.updates)
        self._stage_verify(plan, shape.batch)
        self.features.stage(shape.features, shape.batch, verified, companions)
        self._dwork = _Work(plan, shape, verified, companions)

    def _stage_rows(self, plan: StepPlan, shape: StepShape, tables: dict[int, tuple[int, ...]],
                    companions: dict[int, int]) -> None:
        """Each request's rows (its chunk, then K draft rows if it samples, unused ones fed token 0
        at their reserved positions, which later steps overwrite), and its CFG companion's (the
        companion's chunk and the same drafts, at its own positions: right after the request's
        rows in a dense step, in row set B + g of a bucket); padding rows decode token 0 at
        position 0 into the pad block. A sampling request's K+1 rows are its lane's logits rows;
        its companion's K+1 rows are logits rows (B + g)(K+1) + j."""
        h, k1, bs, slots = self.staging.np, self.k + 1, self.kv.block_size, len(self.step)
        logits = h["logit_rows"]
        at = 0

        def put(at: int, tokens: list[int], start: int, table: int, logits_at: int | None) -> int:
            n = len(tokens)
            h["input_ids"][at: at + n] = tokens
            h["positions"][at: at + n] = np.arange(start, start + n)
            h["write_slots"][at: at + n] = slots_of(tables[table], bs, start, n)
            h["row_table"][at: at + n] = table
            if logits_at is not None:
                logits[logits_at: logits_at + k1] = np.arange(at, at + k1)
            return at + n

        for s in plan.snapshots:
            slot = self.step[s.slot]
            pad: list[int] = []
            if s.sample:
                drafts = slot.drafts if slot.error is None else ()
                pad = list(drafts) + [0] * (k1 - 1 - len(drafts))
            own = slot.lane * k1 if s.sample else None
            at = put(slot.lane * k1 if shape.graph else at, list(s.chunk) + pad, s.start, s.slot, own)
            if s.guide is not None:
                g = (shape.batch + companions[slot.lane]) * k1 if s.sample else None
                first = at             # the companion's first row
                if shape.graph:
                    assert g is not None, "a bucket's requests all sample (step_shape)"
                    first = g
                at = put(first, list(s.guide.chunk) + pad, s.guide.start, slots + s.slot, g)
        if shape.graph:                          # a bucket's unused row sets are padding rows
            used = len(plan.snapshots)
            sets = [(used, shape.batch), (shape.batch + len(companions), shape.batch + shape.features.guides)]
            spans = [(a * k1, b * k1) for a, b in sets]
        else:
            spans = [(at, shape.rows)]
        for lo, hi in spans:
            for name, value in (("input_ids", 0), ("positions", 0), ("write_slots", self.pad_slot),
                                ("row_table", self.staging.pad_table)):
                h[name][lo: hi] = value
            if shape.graph:
                logits[lo: hi] = 0

    def _stage_updates(self, updates: list[tuple[int, int]], room: int) -> None:
        h = self.staging.np
        n = len(updates)
        if n:
            h["update_index"][:n], h["update_block"][:n] = zip(*updates)
        h["update_index"][n: room] = self.staging.scratch
        h["update_block"][n: room] = 0

    def _stage_verify(self, plan: StepPlan, batch: int) -> None:
        """Each lane's verification inputs: an unverified lane (a request failed in the prologue, or
        bucket padding) is greedy, unconstrained and draftless, and its result is never read."""
        v, k, b = self.staging.np_verify, self.k, self.step
        v["num_drafts"][:batch] = 0
        v["constrained"][:batch] = False
        v["temperature"][:batch] = 0.0
        v["top_k"][:batch] = 0
        v["top_p"][:batch] = 1.0
        v["uniforms"][:batch] = 0.0
        for s in plan.snapshots:
            slot = b[s.slot]
            if not s.sample or slot.error is not None:
                continue
            lane, drafts = slot.lane, slot.drafts
            v["drafts"][lane, : len(drafts)] = drafts
            v["drafts"][lane, len(drafts):] = 0
            v["num_drafts"][lane] = len(drafts)
            v["constrained"][lane] = s.constrained
            v["temperature"][lane] = 0.0 if s.sampling.greedy else s.sampling.temperature
            v["top_k"][lane] = s.sampling.top_k or 0
            v["top_p"][lane] = s.sampling.top_p or 1.0
            gen = self._generator(s)       # seeded per request, drawn in request order: batch-independent
            if gen is not None:            # K acceptance draws, then the resample draw
                torch.rand(k + 1, generator=gen, out=self.staging.host_verify.uniforms[lane])

    # --- device work -----------------------------------------------------------------------------

    def forward(self, shape: StepShape | None = None) -> None:
        """Device work: upload the rows and table updates, run the target forward for the logits rows."""
        assert shape is not None
        inputs = self.staging.upload_rows(shape.rows, (shape.batch + shape.features.guides) * (self.k + 1),
                                          shape.updates)
        if shape.rounds:
            self._drafts_into_rows(inputs.input_ids, inputs.logit_rows, shape.batch)
        self._logits = self.model(inputs, self.kv)

    def _drafts_into_rows(self, input_ids: torch.Tensor, logit_rows: torch.Tensor, batch: int) -> None:
        """Device work: each lane's draft rows (its verify rows after the first) take the drafts the
        rounds drew, wherever the layout put them. A padding lane's logits rows are all row 0, which is
        never a draft row: it is written its own value."""
        assert self.drafter is not None
        k1 = self.k + 1
        rows = logit_rows[: batch * k1].view(batch, k1)[:, 1:].reshape(-1)
        drafts = self.drafter.dev.tokens[:batch, 1:].reshape(-1).to(input_ids.dtype)
        input_ids.index_copy_(0, rows, torch.where(rows == 0, input_ids[:1], drafts))

    @torch.inference_mode()
    def verify(self, shape: StepShape | None = None) -> None:
        """Device work, after the mask event: mask, verify, copy the results back."""
        assert shape is not None and self._logits is not None
        if shape.batch:
            v, m = self.staging.upload_verify(shape.batch)
            f = self.features.upload(shape.features, shape.batch)
            q = None
            if shape.rounds:              # the drafts, their count and law come from the draft rounds
                assert self.drafter is not None
                dv = self.drafter.dev
                v = replace(v, drafts=dv.tokens[: shape.batch, 1:], num_drafts=dv.num[: shape.batch])
                q = self.drafter.q[: shape.batch] if shape.draft_q else None
            out, lp = verify_features(self._logits, v, m, self.tokenizer_vocab, shape.mode, f, q)
            self.staging.download(out, shape.batch)
            if lp is not None:
                self.features.download(lp, shape.batch, lp.top.shape[2])

    # --- the step's tail (a host function) ---------------------------------------------------------

    def finish(self) -> None:
        """Each verified request's SlotResult (or its SamplingError)."""
        work, self._dwork = self._dwork, None
        assert work is not None
        out = self.staging.np_out
        for lane, s in work.verified:
            accepted = int(out["accepted"][lane])
            tokens = out["tokens"][lane, : accepted + 1].tolist()
            result = self._settle(s, tokens, out["peaks"][lane].tolist(), int(out["valid_drafts"][lane]), accepted)
            if result is not None and s.sampling.logprobs is not None:
                self.step[s.slot].result = replace(result, logprobs=self.features.logprobs(
                    lane, result.new_tokens, s.sampling.logprobs))
