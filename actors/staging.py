"""The device runner's step buffers: a host copy that host functions write (pinned on CUDA, so
the copies are asynchronous and capturable) and a device copy that the step's kernels read.

Terms: R rows (capacity: the largest step), B verified requests (capacity: the max batch),
K draft length, MB blocks per sequence (the block-table width).

Every buffer is allocated once, at full capacity; a step uses the leading `rows` / `batch`
entries. The views a step takes are the same tensors at the same addresses whenever the shape is
the same, which is what lets a captured CUDA graph replay over them.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from interlock.kernels.verify import MaskInputs, VerifyInputs, VerifyOutputs
from interlock.models.device_llama import StepInputs


@dataclass(frozen=True)
class Inputs:
    """What the forward and the verification read, one tensor per field (host or device side)."""

    input_ids: torch.Tensor      # [R] int64
    positions: torch.Tensor      # [R] int64
    write_slots: torch.Tensor    # [R] int64
    tables: torch.Tensor         # [R, MB] int32
    index: torch.Tensor          # [B, K+1] int64
    drafts: torch.Tensor         # [B, K] int64
    num_drafts: torch.Tensor     # [B] int64
    slot_of: torch.Tensor        # [B] int64
    constrained: torch.Tensor    # [B] bool
    temperature: torch.Tensor    # [B] float32
    top_k: torch.Tensor          # [B] int64
    top_p: torch.Tensor          # [B] float32
    uniforms: torch.Tensor       # [B, K+1] float32

    @classmethod
    def allocate(cls, rows: int, batch: int, k: int, max_blocks: int, device: torch.device, pin: bool) -> Inputs:
        def z(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin)

        f32 = torch.float32
        return cls(z(rows), z(rows), z(rows), z(rows, max_blocks, dtype=torch.int32), z(batch, k + 1), z(batch, k),
                   z(batch), z(batch), z(batch, dtype=torch.bool), z(batch, dtype=f32), z(batch), z(batch, dtype=f32),
                   z(batch, k + 1, dtype=f32))


@dataclass(frozen=True)
class Outputs:
    """The verification's results (device side) and their pinned host copy."""

    tokens: torch.Tensor         # [B, K+1] int64
    accepted: torch.Tensor       # [B] int64
    valid_drafts: torch.Tensor   # [B] int64
    peaks: torch.Tensor          # [B, K+1] float32

    @classmethod
    def allocate(cls, batch: int, k: int, pin: bool) -> Outputs:
        z = lambda *shape, dtype=torch.int64: torch.zeros(shape, dtype=dtype, pin_memory=pin)  # noqa: E731
        return cls(z(batch, k + 1), z(batch), z(batch), z(batch, k + 1, dtype=torch.float32))


_ROW_FIELDS = ("input_ids", "positions", "write_slots", "tables")


class StepStaging:
    """Host and device copies of a step's inputs, the device copy of the grammar lane's masks, and
    the pinned host copy of the verification's outputs."""

    def __init__(self, *, rows: int, batch: int, k: int, max_blocks: int, device: torch.device,
                 bitmask: torch.Tensor, rows_filled: torch.Tensor, free: torch.Tensor) -> None:
        pin = device.type == "cuda"
        self.device = device
        self.k = k
        self.host = Inputs.allocate(rows, batch, k, max_blocks, torch.device("cpu"), pin)
        self.dev = Inputs.allocate(rows, batch, k, max_blocks, device, False)
        self.host_masks = MaskInputs(bitmask, rows_filled, free)      # the GrammarActor's (pinned on CUDA)
        self.dev_masks = MaskInputs(*(torch.empty_like(t, device=device) for t in (bitmask, rows_filled, free)))
        self.out = Outputs.allocate(batch, k, pin)

    @property
    def capacity(self) -> tuple[int, int]:
        """(rows, batch) the buffers hold."""
        return self.host.input_ids.shape[0], self.host.drafts.shape[0]

    def upload_rows(self, rows: int) -> StepInputs:
        """Device work: copy the forward's inputs for `rows` rows; the forward reads the returned views."""
        views = {}
        for name in _ROW_FIELDS:
            dst = getattr(self.dev, name)[:rows]
            dst.copy_(getattr(self.host, name)[:rows], non_blocking=True)
            views[name] = dst
        return StepInputs(**views)

    def upload_verify(self, batch: int) -> tuple[VerifyInputs, MaskInputs]:
        """Device work: copy the verification's inputs for `batch` requests and the grammar's masks."""
        views = {}
        for f in fields(VerifyInputs):
            dst = getattr(self.dev, f.name)[:batch]
            dst.copy_(getattr(self.host, f.name)[:batch], non_blocking=True)
            views[f.name] = dst
        for src, dst in zip((self.host_masks.bitmask, self.host_masks.rows_filled, self.host_masks.free),
                            (self.dev_masks.bitmask, self.dev_masks.rows_filled, self.dev_masks.free)):
            dst.copy_(src, non_blocking=True)
        return VerifyInputs(**views), self.dev_masks

    def download(self, result: VerifyOutputs, batch: int) -> None:
        """Device work: the results' asynchronous copy into the pinned host outputs."""
        for name in ("tokens", "accepted", "valid_drafts", "peaks"):
            getattr(self.out, name)[:batch].copy_(getattr(result, name), non_blocking=True)
