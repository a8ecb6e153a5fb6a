"""Linear layers: plain float, and weight-only int8 (the default on CPU).

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

from interlock.kernels.native import int8_linear, native_fits

Weights: TypeAlias = Literal["float", "int8", "int4"]
INT4_GROUP = 32                     # the block size of GGUF's Q4_0/Q4_1, so those weights map exactly


class Linear(nn.Module):
    """y = x @ W^T (+ b) in the weight's dtype; output cast to fp32."""

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

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.register_buffer("dense_weight", weight.to(torch.bfloat16))
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)
        self.dense_dtype = dense_dtype()

    def dense(self, x: torch.Tensor) -> torch.Tensor:
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

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__(weight, bias)
        qweight, scales = quantize_int8(weight.float())
        self._set_quantized(qweight, scales)

    def _set_quantized(self, qweight: torch.Tensor, scales: torch.Tensor) -> None:
        self.register_buffer("qweight", qweight)                # [N, K] int8
        self.register_buffer("scales", scales)                  # [N] bf16: the quantization
        self.register_buffer("scales_f32", scales.float())      # the same values, as the native kernel takes them
        self.native = native_fits(qweight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native:
            y = torch.ops.interlock_cpu.int8_linear(x.float().contiguous(), self.qweight, self.scales_f32)
        else:
            y = int8_linear(x, self.qweight, self.scales, backend="torch")
        return y if self.bias is None else y + self.bias


class Int4Linear(_Quantized):
    """Weight-only int4, asymmetric, one (scale, offset) per group of 32 inputs; bf16 activations.

    A GGUF Q4_1 block (32 weights, w = d*q + m) is exactly such a group, so Q4_1 checkpoints keep
    their values (up to bf16 rounding of d and m). Half the bytes of int8, and the kernel is as
    row-independent as the int8 one.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__(weight, bias)
        packed, scales_zeros = quantize_int4(weight.float())
        self.register_buffer("packed", packed)
        self.register_buffer("scales_zeros", scales_zeros)   # [K/32, N, 2] bf16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, INT4_GROUP,
                                                       self.scales_zeros).float()
        return y if self.bias is None else y + self.bias


def quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group asymmetric int4 in the layout `_weight_int4pack_mm_for_cpu` wants.

    The kernel computes w = (q - 8) * scale + zero, so zero = min + 8 * scale.
    """
    n, k = w.shape
    if k % INT4_GROUP:
        raise ValueError(f"int4 weights need in_features divisible by {INT4_GROUP}, got {k}")
    groups = w.view(n, k // INT4_GROUP, INT4_GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = torch.where(high > low, (high - low) / 15, torch.ones_like(low))
    q = torch.round((groups - low[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.int32).view(n, k)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    scales_zeros = torch.stack([scale, low + 8 * scale], dim=-1).transpose(0, 1).contiguous()
    return packed, scales_zeros.to(torch.bfloat16)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8: w ≈ q * scale[:, None], |q| ≤ 127. Rows of zeros get scale 1."""
    scale = w.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).to(torch.bfloat16)
    q = torch.round(w / scale.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, weights: Weights) -> nn.Module:
    if weights == "int8":
        return Int8Linear(weight, bias)
    if weights == "int4":
        return Int4Linear(weight, bias)
    if weights == "float":
        return Linear(weight, bias)
    raise ValueError(f"weights must be 'float', 'int8' or 'int4', got {weights!r}")


def select_rows(linear: nn.Module, index: torch.Tensor) -> nn.Module:
    """The same layer with only the output rows in `index` (a pruned draft vocabulary's head)."""
    if isinstance(linear, Linear):
        bias = None if linear.bias is None else linear.bias[index].clone()
        return Linear(linear.weight[index].clone(), bias)
    if isinstance(linear, Int8Linear):      # per-row scales: rows are independent, no re-quantizing
        out = Int8Linear.__new__(Int8Linear)
        nn.Module.__init__(out)
        out.register_buffer("dense_weight", linear.dense_weight[index].clone())
        out.dense_dtype = linear.dense_dtype
        out.bias = None if linear.bias is None else nn.Parameter(linear.bias[index].clone(), requires_grad=False)
        out._set_quantized(linear.qweight[index].contiguous(), linear.scales[index].contiguous())
        return out
    raise TypeError(f"cannot select rows of {type(linear).__name__}")
