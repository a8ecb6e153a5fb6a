"""DeviceVerifier: the VerifierActor of the device runner, whose step is fixed-shape tensor work.

Its part of a step (actors/step.py), for a step of shape `StepShape` (rows, batch, mode):
- `begin` (host function): take the plan and write every row's token, position, KV slot and
  block table, and every verified request's drafts, sampling parameters and uniforms, into the
  host staging buffers (actors/staging.py);
- `forward` (device work): copy them to the device, run the target forward (models/device_llama.py);
- after the mask event, `verify` (device work): copy the grammar's masks, mask and verify
  (kernels/verify.py), copy the results back;
- `finish` (host function): each request's SlotResult from the copied results.

Device work reads nothing but those persistent buffers and the shape it is called with, so on
CUDA it is called once when it is enqueued (or captured) and its kernels run when the lane
reaches them; on the CPU timeline it runs in lane order. The host functions run in lane order on
both. A step whose requests all decode (one token and K draft rows each) is laid out in a padded
bucket of B requests x (K+1) rows, the same shape step after step: the StepProgram captures it.
Other steps (prompt chunks) are laid out densely and run eagerly.

Not on this runner yet (refused at intake or at start, never silently): classifier-free guidance,
repetition penalties, log-probabilities and draft models.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from interlock.actors.grammar_actor import MaskBuffers
from interlock.actors.staging import StepStaging
from interlock.actors.step import StepState, StepShape
from interlock.actors.verifier_actor import VerifierActor
from interlock.kernels.verify import Mode, verify_step
from interlock.models.device_llama import DeviceLlama
from interlock.models.kv_cache import PagedKVCache, slots_of
from interlock.protocol.messages import RequestSnapshot, StepPlan
from interlock.streams.timeline import Timeline


def sampling_mode(snaps: list[RequestSnapshot]) -> Mode:
    """Which verification a step's requests need: greedy alone, sampling, or sampling with top-k/top-p."""
    if all(s.sampling.greedy for s in snaps):
        return "greedy"
    return "filtered" if any(s.sampling.top_k or s.sampling.top_p for s in snaps) else "sample"


def step_shape(plan: StepPlan, buckets: tuple[int, ...]) -> StepShape:
    """The step's shape: a bucket when every request decodes one token (plus drafts), else dense rows."""
    snaps = plan.snapshots
    k = plan.max_drafts
    sampled = [s for s in snaps if s.sample]
    mode = sampling_mode(sampled)
    if snaps and len(snaps) <= buckets[-1] and all(s.sample and len(s.chunk) == 1 for s in snaps):
        bucket = next(b for b in buckets if b >= len(snaps))
        return StepShape(bucket * (k + 1), bucket, mode, graph=True)
    rows = sum(len(s.chunk) + (k if s.sample else 0) for s in snaps)
    return StepShape(rows, len(sampled), mode, graph=False)


@dataclass
class _Work:
    plan: StepPlan
    shape: StepShape
    verified: list[tuple[int, RequestSnapshot]]       # (verify row b, request) of the requests verified


class DeviceVerifier(VerifierActor):
    def __init__(self, model: DeviceLlama, kv: PagedKVCache, timeline: Timeline, buffers: MaskBuffers,
                 step: StepState, tokenizer_vocab: int, eos_token_ids: tuple[int, ...], *, max_rows: int,
                 max_drafts: int, buckets: tuple[int, ...], max_blocks: int, pad_block: int) -> None:
        super().__init__(model, kv, timeline, buffers, step, tokenizer_vocab, eos_token_ids,  # type: ignore[arg-type]
                         lean=False)
        self.buckets = buckets
        self.k = max_drafts
        self.pad_block = pad_block          # a KV block outside the pool: padding rows write there
        rows = max(max_rows, buckets[-1] * (max_drafts + 1))
        self.staging = StepStaging(rows=rows, batch=buckets[-1], k=max_drafts, max_blocks=max_blocks,
                                   device=model.device, bitmask=buffers.bitmask, rows_filled=buffers.rows,
                                   free=buffers.free)
        self._logits: torch.Tensor | None = None
        self._dwork: _Work | None = None

    def shape_of(self, plan: StepPlan) -> StepShape:
        return step_shape(plan, self.buckets)

    # --- model lane ------------------------------------------------------------------------------

    def begin(self) -> None:
        """Host function: stage the step's rows and its verification inputs (module docstring)."""
        plan = self.queue.take()
        b = self.step
        shape = self.shape_of(plan)     # as StepProgram.launch computed it: a captured host function takes no arguments
        for s in plan.snapshots:
            b[s.slot].result = None
        rows = _Rows(plan, self.kv.block_size, self.k, self.pad_block * self.kv.block_size)
        verified: list[tuple[int, RequestSnapshot]] = []
        for i, s in enumerate(plan.snapshots):
            ok = s.sample and b[s.slot].error is None
            drafts = b[s.slot].drafts if ok else ()
            first = rows.add(s, drafts, at=i * (self.k + 1) if shape.graph else None)
            if ok:
                verified.append((len(verified), s))
                rows.verify(first, s, drafts)
        rows.pad_to(shape.rows)
        rows.pad_requests(shape.batch)
        self._stage(rows, verified)
        self._dwork = _Work(plan, shape, verified)

    def _stage(self, rows: _Rows, verified: list[tuple[int, RequestSnapshot]]) -> None:
        h, v = self.staging.host.rows, self.staging.host.verify
        n = len(rows.ids)
        h.input_ids[:n] = torch.tensor(rows.ids)
        h.positions[:n] = torch.tensor(rows.positions)
        h.write_slots[:n] = torch.tensor(rows.slots)
        for first, count, table in rows.tables:      # one block table per request, not per row
            h.tables[first: first + count, : len(table)] = torch.tensor(table, dtype=torch.int32)
            h.tables[first: first + count, len(table):] = 0
        m = len(rows.index)
        if not m:
            return
        v.index[:m] = torch.tensor(rows.index)
        v.drafts[:m] = torch.tensor(rows.drafts).view(m, self.k)
        v.num_drafts[:m] = torch.tensor(rows.num_drafts)
        v.slot_of[:m] = torch.tensor(rows.slot_of)
        v.constrained[:m] = torch.tensor(rows.constrained)
        v.temperature[:m] = torch.tensor(rows.temperature)
        v.top_k[:m] = torch.tensor(rows.top_k)
        v.top_p[:m] = torch.tensor(rows.top_p)
        v.uniforms[:m] = 0.0
        for b, s in verified:       # seeded per request, drawn in request order: batch-independent
            gen = self._generator(s)
            if gen is not None:
                v.uniforms[b] = torch.rand(self.k + 1, generator=gen)  # K acceptance draws, then the resample draw

    def forward(self, shape: StepShape | None = None) -> None:
        """Device work: upload the rows, run the target forward."""
        assert shape is not None
        self._logits = self.model(self.staging.upload_rows(shape.rows), self.kv)

    def verify(self, shape: StepShape | None = None) -> None:
        """Device work, after the mask event: mask, verify, copy the results back."""
        assert shape is not None and self._logits is not None
        if shape.batch:
            v, m = self.staging.upload_verify(shape.batch)
            self.staging.download(verify_step(self._logits, v, m, self.tokenizer_vocab, shape.mode), shape.batch)

    def finish(self) -> None:
        """Host function: each verified request's SlotResult (or its SamplingError)."""
        work, self._dwork = self._dwork, None
        assert work is not None
        out = self.staging.out
        tokens, accepted = out.tokens.tolist(), out.accepted.tolist()
        valid, peaks = out.valid_drafts.tolist(), out.peaks.tolist()
        for v, s in work.verified:
            self._settle(s, tokens[v][: accepted[v] + 1], peaks[v], valid[v], accepted[v])


class _Rows:
    """Host lists of one step's layout, built request by request, then copied in one go."""

    def __init__(self, plan: StepPlan, block_size: int, k: int, pad_slot: int) -> None:
        self.plan, self.bs, self.k, self.pad_slot = plan, block_size, k, pad_slot
        self.ids: list[int] = []
        self.positions: list[int] = []
        self.slots: list[int] = []
        self.tables: list[tuple[int, int, list[int]]] = []     # (first row, rows, block table)
        self.index: list[list[int]] = []
        self.drafts: list[int] = []
        self.num_drafts: list[int] = []
        self.slot_of: list[int] = []
        self.constrained: list[bool] = []
        self.temperature: list[float] = []
        self.top_k: list[int] = []
        self.top_p: list[float] = []

    def add(self, s: RequestSnapshot, drafts: tuple[int, ...], at: int | None) -> int:
        """A request's rows (its chunk, then K draft rows if it samples, unused ones fed token 0 at
        their reserved positions, which later steps overwrite); returns its first row."""
        if at is not None:
            self.pad_to(at)
        first = len(self.ids)
        tokens = list(s.chunk)
        if s.sample:
            tokens += list(drafts) + [0] * (self.k - len(drafts))
        assert self.plan.kv is not None
        table = list(self.plan.kv.block_table(s.seq))
        self.ids += tokens
        self.positions += range(s.start, s.start + len(tokens))
        self.slots += slots_of(table, self.bs, s.start, len(tokens))
        self.tables.append((first, len(tokens), table))
        return first

    def verify(self, first: int, s: RequestSnapshot, drafts: tuple[int, ...]) -> None:
        self.index.append(list(range(first, first + self.k + 1)))
        self.drafts += list(drafts) + [0] * (self.k - len(drafts))
        self.num_drafts.append(len(drafts))
        self.slot_of.append(s.slot)
        self.constrained.append(s.constrained)
        self.temperature.append(0.0 if s.sampling.greedy else float(s.sampling.temperature))
        self.top_k.append(s.sampling.top_k or 0)
        self.top_p.append(float(s.sampling.top_p or 1.0))

    def pad_to(self, rows: int) -> None:
        """Padding rows up to `rows`: token 0 at position 0, writing K/V to the pad block's first
        slot (a block outside the pool) and attending to it alone."""
        n = rows - len(self.ids)
        if n <= 0:
            return
        self.ids += [0] * n
        self.positions += [0] * n
        self.tables.append((len(self.ids) - n, n, [self.pad_slot // self.bs]))
        self.slots += [self.pad_slot] * n

    def pad_requests(self, batch: int) -> None:
        """Verification padding up to `batch` requests: greedy, unconstrained, no drafts, reading row 0."""
        for _ in range(batch - len(self.index)):
            self.index.append([0] * (self.k + 1))
            self.drafts += [0] * self.k
            self.num_drafts.append(0)
            self.slot_of.append(0)
            self.constrained.append(False)
            self.temperature.append(0.0)
            self.top_k.append(0)
            self.top_p.append(1.0)
