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
    """What the forward reads (StepInputs, [R] rows) and what the verification reads (VerifyInputs,
    [B] requests): one side's copy, host or device."""

    rows: StepInputs
    verify: VerifyInputs

    @classmethod
    def allocate(cls, rows: int, batch: int, k: int, max_blocks: int, device: torch.device, pin: bool) -> Inputs:
        def z(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin)

        f32 = torch.float32
        return cls(StepInputs(z(rows), z(rows), z(rows), z(rows, max_blocks, dtype=torch.int32)),
                   VerifyInputs(z(batch, k + 1), z(batch, k), z(batch), z(batch), z(batch, dtype=torch.bool),
                                z(batch, dtype=f32), z(batch), z(batch, dtype=f32), z(batch, k + 1, dtype=f32)))


def pinned_outputs(batch: int, k: int, pin: bool) -> VerifyOutputs:
    """The host copy of the verification's results, [B] requests (pinned on CUDA)."""
    z = lambda *shape, dtype=torch.int64: torch.zeros(shape, dtype=dtype, pin_memory=pin)  # noqa: E731
    return VerifyOutputs(z(batch, k + 1), z(batch), z(batch), z(batch, k + 1, dtype=torch.float32))


def _copy_leading(dst: object, src: object, n: int) -> object:
    """Copy the first n entries of each tensor field of src into dst's (asynchronously from pinned
    memory); returns dst's views of them, as an instance of dst's class."""
    views = {}
    for f in fields(dst):  # type: ignore[arg-type]
        view = getattr(dst, f.name)[:n]
        view.copy_(getattr(src, f.name)[:n], non_blocking=True)
        views[f.name] = view
    return type(dst)(**views)


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
        self.out = pinned_outputs(batch, k, pin)

    def upload_rows(self, rows: int) -> StepInputs:
        """Device work: copy the forward's inputs for `rows` rows; the forward reads the returned views."""
        return _copy_leading(self.dev.rows, self.host.rows, rows)  # type: ignore[return-value]

    def upload_verify(self, batch: int) -> tuple[VerifyInputs, MaskInputs]:
        """Device work: copy the verification's inputs for `batch` requests and the grammar's masks."""
        verify = _copy_leading(self.dev.verify, self.host.verify, batch)
        for f in fields(MaskInputs):
            getattr(self.dev_masks, f.name).copy_(getattr(self.host_masks, f.name), non_blocking=True)
        return verify, self.dev_masks  # type: ignore[return-value]

    def download(self, result: VerifyOutputs, batch: int) -> None:
        """Device work: the results' asynchronous copy into the pinned host outputs."""
        for f in fields(VerifyOutputs):
            getattr(self.out, f.name)[:batch].copy_(getattr(result, f.name), non_blocking=True)
