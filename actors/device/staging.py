"""The device runner's step buffers: a host copy that the prologue writes (pinned on CUDA, so the
copies are asynchronous and capturable) and a device copy that the step's kernels read.

Terms: R rows (capacity: the largest step), B verified requests (capacity: the max batch), K
draft length, N = (B + G) * (K+1) logits rows (G: classifier-free guidance's companions, up to
`companions`), S block-table rows (one per sequence a step may feed), MB blocks per sequence
(the block-table width), U block-table entries a step writes.

Every buffer is allocated once, at full capacity, and a step copies only what it uses: the
leading R rows, N logits rows and B requests, the masks of its B lanes. The views a step takes
are the same tensors at the same addresses whenever the shape is the same, which is what lets a
captured CUDA graph replay over them. The host side is written through numpy views of the same
memory: a step builds no tensor.

Block tables live on the device, one row per table row the runner assigns (its slots', then their
CFG companions': `tables`, [S + 2, MB]: row S holds the padding
rows' block, row S + 1 takes the writes a step does not need), and change only where a
sequence's table changed: `TableMirror` keeps the host's view of them and turns a step's tables
into (flat index, block) updates, which the step scatters into `tables` on the device.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from interlock.kernels.verify import MaskInputs, VerifyInputs, VerifyOutputs
from interlock.models.device_llama import StepInputs
from interlock.models.table_mirror import TableMirror, numpy_views

__all__ = ["Rows", "StepStaging", "TableMirror", "allocate_verify", "numpy_views"]


@dataclass(frozen=True)
class Rows:
    """What the forward reads per row ([R]), per logits row ([N]), and the table updates ([U])."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    write_slots: torch.Tensor
    row_table: torch.Tensor
    logit_rows: torch.Tensor
    update_index: torch.Tensor      # flat index into `tables`
    update_block: torch.Tensor      # int32

    @classmethod
    def allocate(cls, rows: int, logits: int, updates: int, device: torch.device, pin: bool) -> Rows:
        def z(n: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.zeros(n, dtype=dtype, device=device, pin_memory=pin)

        return cls(z(rows), z(rows), z(rows), z(rows), z(logits), z(updates), z(updates, torch.int32))


def allocate_verify(batch: int, k: int, device: torch.device, pin: bool) -> VerifyInputs:
    def z(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin)

    f32 = torch.float32
    return VerifyInputs(z(batch, k), z(batch), z(batch, dtype=torch.bool), z(batch, dtype=f32), z(batch),
                        z(batch, dtype=f32), z(batch, k + 1, dtype=f32))


class StepStaging:
    """Host and device copies of a step's inputs and the grammar's masks, and the pinned host copy
    of the verification's outputs."""

    def __init__(self, *, rows: int, batch: int, k: int, slots: int, max_blocks: int, updates: int,
                 pad_block: int, device: torch.device, bitmask: torch.Tensor, rows_filled: torch.Tensor,
                 free: torch.Tensor, companions: int = 0) -> None:
        pin = device.type == "cuda"
        cpu = torch.device("cpu")
        self.device, self.k, self.slots = device, k, slots
        logits = (batch + companions) * (k + 1)          # the requests' verify rows, then CFG companions'
        self.host = Rows.allocate(rows, logits, updates, cpu, pin)
        self.dev = Rows.allocate(rows, logits, updates, device, False)
        self.host_verify = allocate_verify(batch, k, cpu, pin)
        self.dev_verify = allocate_verify(batch, k, device, False)
        self.np = numpy_views(self.host)
        self.np_verify = numpy_views(self.host_verify)
        self.mirror = TableMirror(slots, max_blocks)
        self.tables = torch.zeros(slots + 2, max_blocks, dtype=torch.int32)
        self.tables[slots, 0] = pad_block
        self.tables = self.tables.to(device)
        self.pad_table = slots                         # row_table of padding rows
        self.scratch = (slots + 1) * max_blocks        # where unused updates write
        self.host_masks = MaskInputs(bitmask, rows_filled, free)      # the GrammarActor's (pinned on CUDA)
        self.dev_masks = MaskInputs(*(torch.empty_like(t, device=device) for t in (bitmask, rows_filled, free)))
        self.out = VerifyOutputs(*(torch.zeros(shape, dtype=dtype, pin_memory=pin) for shape, dtype in (
            ((batch, k + 1), torch.int64), ((batch,), torch.int64), ((batch,), torch.int64),
            ((batch, k + 1), torch.float32))))
        self.np_out = numpy_views(self.out)
        if device.type == "cuda":
            torch.cuda.synchronize(device)             # the tables' init precedes every lane's work

    # --- device work (called when the step is enqueued; the copies run in lane order) ----------

    def upload_rows(self, rows: int, logits: int, updates: int) -> StepInputs:
        """Copy the forward's inputs, apply the table updates; the forward reads the returned views."""
        h, d = self.host, self.dev

        def up(name: str, n: int) -> torch.Tensor:
            view = getattr(d, name)[:n]
            view.copy_(getattr(h, name)[:n], non_blocking=True)
            return view

        index, block = up("update_index", updates), up("update_block", updates)
        if updates:
            self.tables.view(-1).index_copy_(0, index, block)
        return StepInputs(up("input_ids", rows), up("positions", rows), up("write_slots", rows),
                          up("row_table", rows), self.tables, up("logit_rows", logits))

    def upload_verify(self, batch: int) -> tuple[VerifyInputs, MaskInputs]:
        """Copy the verification's inputs for `batch` requests and their lanes' masks."""
        views = {}
        for f in fields(VerifyInputs):
            view = getattr(self.dev_verify, f.name)[:batch]
            view.copy_(getattr(self.host_verify, f.name)[:batch], non_blocking=True)
            views[f.name] = view
        rows = batch * (self.k + 1)
        masks = []
        for f, n in zip(fields(MaskInputs), (rows, batch, rows)):
            view = getattr(self.dev_masks, f.name)[:n]
            view.copy_(getattr(self.host_masks, f.name)[:n], non_blocking=True)
            masks.append(view)
        return VerifyInputs(**views), MaskInputs(*masks)

    def download(self, result: VerifyOutputs, batch: int) -> None:
        """The results' asynchronous copy into the pinned host outputs."""
        for f in fields(VerifyOutputs):
            getattr(self.out, f.name)[:batch].copy_(getattr(result, f.name), non_blocking=True)
