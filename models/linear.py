"""Linear layers: plain float, weight-only int8, and 4-bit (int4, the default for 4-bit GGUFs).

Why int8 weight-only: decoding one token reads every weight once, so a CPU decoder is bound by
weight bytes. int8 weights are 1/4 of the fp32 bytes, and the int8 kernels (kernels/native.py: ours, or
torch's `_weight_int8pack_mm`) — unlike fp32 sgemm, whose result for a row changes with the number
of rows — compute each row independently. That batch invariance is what lets a speculative verify step (K+1 rows)
or a batch
of other requests reproduce a single-token step bit for bit. Measured in benchmarks/model_speed.py.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal, TypeAlias

import torch
import torch.nn.functional as F
from torch import nn

from interlock.kernels import native
from interlock.kernels.native import int8_linear, native_fits
from interlock.kernels.int4_pack import quantize_int4

Weights: TypeAlias = Literal["float", "int8", "int4"]
WeightsChoice: TypeAlias = Literal["auto", "float", "int8", "int4"]     # "auto": loader.resolve_weights


class Linear(nn.Module):
    """y = x @ W^T (+ b) in the weight's dtype; output cast to fp32."""

    weight: nn.Parameter
    bias: nn.Parameter | None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        return F.linear(x.to(w.dtype), w, None if self.bias is None else self.bias.to(w.dtype)).float()

    dense = forward


@functools.cache
def dense_dtype() -> torch.dtype:
    """The dtype prompt-chunk GEMMs compute in on this CPU: bf16 where it has bf16 dot products
    (AVX512-BF16 or AMX-BF16), else fp32. Without them oneDNN's bf16 GEMM converts as it goes and
    runs at a fraction of sgemm's speed (9-11 vs 44-120 GFLOP/s at 256 rows on a 2-core AVX2 EPYC:
    benchmarks/prefill_speed.py measures both). From /proc/cpuinfo, so the choice is the same in
    every process on a machine; fp32 where there is none to read."""
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        flags = ""
    return dense_dtype_for(set(flags.split()))


def dense_dtype_for(cpu_flags: set[str]) -> torch.dtype:
    return torch.bfloat16 if {"avx512_bf16", "amx_bf16"} & cpu_flags else torch.float32


class _Quantized(nn.Module):
    """Shared by the weight-only kinds: a bf16 copy of the weight for prompt chunks.

    Decode and verify rows are few, so the weight-only kernels (bytes-bound) win there; a prompt
    chunk has hundreds of rows and is compute-bound, where a GEMM is several times faster than
    them. The GEMM runs in `dense_dtype` (the bf16 copy widened per call where that is fp32: a
    few percent of a 256-row chunk's time, and no second copy of the weights kept). Each chunk
    gets its own GEMM, so its rows never depend on what else is in the step.
    """

    dense_weight: torch.Tensor | None       # buffers, declared for the type checker
    bias: nn.Parameter | None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.register_buffer("dense_weight", weight.to(torch.bfloat16))
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)
        self.dense_dtype = dense_dtype()

    def dense(self, x: torch.Tensor) -> torch.Tensor:
        if self.dense_weight is None:            # loaded quantized (models/packed.py): the kernel serves chunks too
            return self.forward(x)
        dt = self.dense_dtype
        y = F.linear(x.to(dt), self.dense_weight.to(dt)).float()
        return y if self.bias is None else y + self.bias


class Int8Linear(_Quantized):
    """Weight-only int8 (symmetric, one scale per output row).

    Decode and verify rows go through kernels.native.int8_linear: our native kernel (activations
    quantized to int8 in blocks of 32, int8 dots on AMX tiles or VNNI; 4 rows cost ~1.1x one)
    where it builds, else torch's `_weight_int8pack_mm` (bf16 activations). The choice is
    made once per process, so every row of every step takes the same arithmetic.
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    scales_f32: torch.Tensor

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__(weight, bias)
        qweight, scales = quantize_int8(weight.float())
        self._set_quantized(qweight, scales)

    @classmethod
    def from_quantized(cls, qweight: torch.Tensor, scales: torch.Tensor,
                       bias: torch.Tensor | None = None) -> Int8Linear:
        """From int8 rows and their bf16 scales, with no float copy: prompt chunks take the int8 kernel."""
        out = cls.__new__(cls)
        nn.Module.__init__(out)
        out.dense_weight = None
        out.dense_dtype = dense_dtype()
        out.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)
        out._set_quantized(qweight, scales)
        return out

    def _set_quantized(self, qweight: torch.Tensor, scales: torch.Tensor) -> None:
        self.register_buffer("qweight", qweight)                # [N, K] int8
        self.register_buffer("scales", scales)                  # [N] bf16: the quantization
        self.register_buffer("scales_f32", scales.float())      # the same values, as the native kernel takes them
        self.native = native_fits(qweight)

    @property
    def kernel_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What rows_forward takes for this projection (ops.cpp check_weight)."""
        return self.qweight, self.scales_f32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native:
            y = torch.ops.interlock_cpu.int8_linear(x.float().contiguous(), self.qweight, self.scales_f32)
        else:
            y = int8_linear(x, self.qweight, self.scales, backend="torch")
        return y if self.bias is None else y + self.bias


class Int4Linear(nn.Module):
    """4-bit weights (kernels/int4_pack.py: 256-weight super-blocks, ~4.8 bits a weight) through the
    native int4 kernel (kernels/csrc/int4_linear.h), for every row count: decode and verify rows
    (memory-bound: 0.57x the bytes of int8) and prompt chunks alike, so no float copy is kept and a
    row's bits never depend on the other rows (batch invariant). Needs the native kernels."""

    records: torch.Tensor
    offsets: torch.Tensor
    bias: nn.Parameter | None

    def __init__(self, records: torch.Tensor, offsets: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if not native.available():
            raise ValueError("int4 weights need the native CPU kernels (kernels/native.py), which did not build here")
        self.register_buffer("records", records)          # [N, row_bytes(K)] uint8
        self.register_buffer("offsets", offsets)          # [N, K / 32] fp16
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)
        self.native = True

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int4Linear:
        records, offsets = quantize_int4(weight.float())
        return cls(torch.from_numpy(records), torch.from_numpy(offsets), bias)

    @property
    def kernel_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What rows_forward takes for this projection (ops.cpp check_weight)."""
        return self.records, self.offsets

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.interlock_cpu.int4_linear(x.float().contiguous(), self.records, self.offsets)
        return y if self.bias is None else y + self.bias

    dense = forward


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8: w ≈ q * scale[:, None], |q| ≤ 127. Rows of zeros get scale 1."""
    scale = w.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).to(torch.bfloat16)
    q = torch.round(w / scale.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def head_weights(weights: Weights) -> Weights:
    """The head's kind under `weights`: int8 under int4 too. The head decides every token (its
    error reaches the logits unmixed), GGUFs keep it at 6 or 8 bits, and greedy verification's
    head_argmax reads int8 rows."""
    return "int8" if weights == "int4" else weights


# What a model's projections are: the forward and the fused rows path read each kind's attributes.
Projection: TypeAlias = "Linear | Int8Linear | Int4Linear"


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, weights: Weights) -> Projection:
    if weights == "int8":
        return Int8Linear(weight, bias)
    if weights == "int4":
        return Int4Linear.from_float(weight, bias)
    if weights == "float":
        return Linear(weight, bias)
    raise ValueError(f"weights must be 'float', 'int8' or 'int4', got {weights!r}")


def select_rows(linear: Projection, index: torch.Tensor) -> Projection:
    """The same layer with only the output rows in `index` (a pruned draft vocabulary's head)."""
    if isinstance(linear, Linear):
        bias = None if linear.bias is None else linear.bias[index].clone()
        return Linear(linear.weight[index].clone(), bias)
    if isinstance(linear, Int8Linear):      # per-row scales: rows are independent, no re-quantizing
        out = Int8Linear.__new__(Int8Linear)
        nn.Module.__init__(out)
        out.dense_weight = None if linear.dense_weight is None else linear.dense_weight[index].clone()
        out.dense_dtype = linear.dense_dtype
        out.bias = None if linear.bias is None else nn.Parameter(linear.bias[index].clone(), requires_grad=False)
        out._set_quantized(linear.qweight[index].contiguous(), linear.scales[index].contiguous())
        return out
    raise TypeError(f"cannot select rows of {type(linear).__name__}")
