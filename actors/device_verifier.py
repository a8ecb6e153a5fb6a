"""DeviceVerifier: the VerifierActor of the device runner, whose step is fixed-shape tensor work.

Its part of a step (actors/step.py), for a step of shape `StepShape` (rows, batch, mode, updates):
- `begin` + `stage`, in the prologue on the event loop: every row's token, position, KV slot and
  block-table row, the logits rows (each sampling request's K+1 verify rows, nothing for prompt
  chunks), the block-table entries that changed, and every verified request's drafts, sampling
  parameters and uniforms, written into the host staging buffers (actors/staging.py);
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
leading rows. Not on this runner yet (refused at intake or at start, never silently):
classifier-free guidance, repetition penalties, log-probabilities and draft models.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from interlock.actors.grammar_actor import MaskBuffers
from interlock.actors.staging import StepStaging
from interlock.actors.step import StepShape
from interlock.actors.step_state import StepState
from interlock.actors.verifier_actor import VerifierActor
from interlock.drafters.device_draft import DeviceDrafter
from interlock.kernels.verify import Mode, verify_step
from interlock.models.device_llama import DeviceLlama
from interlock.models.kv_cache import PagedKVCache, slots_of
from interlock.protocol.messages import RequestSnapshot, StepPlan
from interlock.streams.timeline import Timeline

UPDATES_PER_REQUEST = 2     # table entries a decode step may write per request (K+1 <= block size)


def sampling_mode(snaps: list[RequestSnapshot]) -> Mode:
    """Which verification a step's requests need: greedy alone, sampling, or sampling with top-k/top-p."""
    if all(s.sampling.greedy for s in snaps):
        return "greedy"
    return "filtered" if any(s.sampling.top_k or s.sampling.top_p for s in snaps) else "sample"


def step_shape(plan: StepPlan, buckets: tuple[int, ...], updates: int, state: StepState | None = None) -> StepShape:
    """The step's shape: a bucket when every request decodes one token (plus drafts) and its table
    updates fit the bucket's room, else dense rows; with the draft rounds the prologue staged."""
    snaps = plan.snapshots
    k = plan.max_drafts
    sampled = [s for s in snaps if s.sample]
    mode = sampling_mode(sampled)
    rounds = {} if state is None or not state.draft_rounds else \
        {"rounds": state.draft_rounds, "draft_q": state.draft_q, "draft_rows": state.draft_rows}
    if snaps and len(snaps) <= buckets[-1] and all(s.sample and len(s.chunk) == 1 for s in snaps):
        bucket = next(b for b in buckets if b >= len(snaps))
        if updates <= bucket * UPDATES_PER_REQUEST:
            return StepShape(bucket * (k + 1), bucket, mode, graph=True, updates=bucket * UPDATES_PER_REQUEST,
                             **rounds)
    rows = sum(len(s.chunk) + (k if s.sample else 0) for s in snaps)
    return StepShape(rows, len(sampled), mode, graph=False, updates=updates, **rounds)


@dataclass
class _Work:
    plan: StepPlan
    shape: StepShape
    verified: list[tuple[int, RequestSnapshot]]       # (lane, request) of the requests verified


class DeviceVerifier(VerifierActor):
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
        rows = max(max_rows, buckets[-1] * (max_drafts + 1))
        # a step writes at most every slot's whole table (a prefix-cache hit), or 2 entries per request
        updates = max(slots * max_blocks, buckets[-1] * UPDATES_PER_REQUEST)
        self.staging = StepStaging(rows=rows, batch=max(slots, buckets[-1]), k=max_drafts, slots=slots,
                                   max_blocks=max_blocks, updates=updates, pad_block=pad_block,
                                   device=model.device, bitmask=buffers.bitmask, rows_filled=buffers.rows,
                                   free=buffers.free)
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
        tables = {s.slot: plan.kv.block_table(s.seq) for s in plan.snapshots}
        for s in plan.snapshots:
            b[s.slot].result = None
            st.mirror.updates(s.slot, s.seq, tables[s.slot], updates)
        shape = step_shape(plan, self.buckets, len(updates), b)
        verified = [(b[s.slot].lane, s) for s in plan.snapshots if s.sample and b[s.slot].error is None]
        self._stage_rows(plan, shape, tables)
        self._stage_updates(updates, shape.updates)
        self._stage_verify(plan, shape.batch)
        self._dwork = _Work(plan, shape, verified)

    def _stage_rows(self, plan: StepPlan, shape: StepShape, tables: dict[int, tuple[int, ...]]) -> None:
        """Each request's rows (its chunk, then K draft rows if it samples, unused ones fed token 0
        at their reserved positions, which later steps overwrite); padding rows decode token 0 at
        position 0 into the pad block. A sampling request's K+1 rows are its lane's logits rows."""
        h, k, bs = self.staging.np, self.k, self.kv.block_size
        at = 0
        logits = h["logit_rows"]
        for s in plan.snapshots:
            slot = self.step[s.slot]
            if shape.graph:
                at = slot.lane * (k + 1)             # a bucket: request b's rows at b*(K+1)
            tokens = list(s.chunk)
            if s.sample:
                drafts = slot.drafts if slot.error is None else ()
                tokens += list(drafts) + [0] * (k - len(drafts))
                logits[slot.lane * (k + 1): (slot.lane + 1) * (k + 1)] = np.arange(at, at + k + 1)
            n = len(tokens)
            h["input_ids"][at: at + n] = tokens
            h["positions"][at: at + n] = np.arange(s.start, s.start + n)
            h["write_slots"][at: at + n] = slots_of(tables[s.slot], bs, s.start, n)
            h["row_table"][at: at + n] = s.slot
            at += n
        used = len(plan.snapshots) if shape.graph else at
        filled = sum(1 for s in plan.snapshots if s.sample)
        if shape.graph:                                    # a bucket's unused requests are padding rows
            for name, value in (("input_ids", 0), ("positions", 0), ("write_slots", self.pad_slot),
                                ("row_table", self.staging.pad_table)):
                h[name][used * (k + 1): shape.rows] = value
            logits[filled * (k + 1): shape.batch * (k + 1)] = 0
        else:
            for name, value in (("input_ids", 0), ("positions", 0), ("write_slots", self.pad_slot),
                                ("row_table", self.staging.pad_table)):
                h[name][at: shape.rows] = value

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
        lanes = shape.batch * (self.k + 1)
        inputs = self.staging.upload_rows(shape.rows, lanes, shape.updates)
        if shape.rounds:                  # the lanes' rows are their tokens [t, d1..dD] (lanes lead the rows)
            assert self.drafter is not None
            inputs.input_ids[:lanes].view(shape.batch, self.k + 1).copy_(self.drafter.dev.tokens[: shape.batch])
        self._logits = self.model(inputs, self.kv)

    @torch.inference_mode()
    def verify(self, shape: StepShape | None = None) -> None:
        """Device work, after the mask event: mask, verify, copy the results back."""
        assert shape is not None and self._logits is not None
        if not shape.batch:
            return
        v, m = self.staging.upload_verify(shape.batch)
        q = None
        if shape.rounds:                  # the drafts, their count and law come from the draft rounds
            assert self.drafter is not None
            dv = self.drafter.dev
            v = replace(v, drafts=dv.tokens[: shape.batch, 1:], num_drafts=dv.num[: shape.batch])
            q = self.drafter.q[: shape.batch] if shape.draft_q else None
        out = verify_step(self._logits, v, m, self.tokenizer_vocab, shape.mode, draft_probs=q)
        self.staging.download(out, shape.batch)

    # --- the step's tail (a host function) ---------------------------------------------------------

    def finish(self) -> None:
        """Each verified request's SlotResult (or its SamplingError)."""
        work, self._dwork = self._dwork, None
        assert work is not None
        out = self.staging.np_out
        for lane, s in work.verified:
            accepted = int(out["accepted"][lane])
            tokens = out["tokens"][lane, : accepted + 1].tolist()
            self._settle(s, tokens, out["peaks"][lane].tolist(), int(out["valid_drafts"][lane]), accepted)
