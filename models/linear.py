"""Linear layers: plain float, and weight-only int8 (the default on CPU).

Why int8 weight-only: decoding one token reads every weight once, so a CPU decoder is bound by
weight bytes. torch's `_weight_int8pack_mm` with bf16 activations reads 1/4 of the fp32 bytes, and
— unlike fp32 sgemm, whose result for a row changes with the number of rows — it computes each row
independently. That batch invariance is what lets a speculative verify step (K+1 rows) or a batch
of other requests reproduce a single-token step bit for bit. Measured in benchmarks/model_speed.py.
"""
from __future__ import annotations

from typing import Literal, TypeAlias

import torch
import torch.nn.functional as F
from torch import nn

Weights: TypeAlias = Literal["float", "int8"]


class Linear(nn.Module):
    """y = x @ W^T (+ b) in the weight's dtype; output cast to fp32."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        return F.linear(x.to(w.dtype), w, None if self.bias is None else self.bias.to(w.dtype)).float()


class Int8Linear(nn.Module):
    """Weight-only int8 (symmetric, one scale per output row); bf16 activations into the kernel."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        qweight, scales = quantize_int8(weight.float())
        self.register_buffer("qweight", qweight)        # [N, K] int8
        self.register_buffer("scales", scales)          # [N] bf16
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.qweight, self.scales).float()
        return y if self.bias is None else y + self.bias


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8: w ≈ q * scale[:, None], |q| ≤ 127. Rows of zeros get scale 1."""
    scale = w.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).to(torch.bfloat16)
    q = torch.round(w / scale.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, weights: Weights) -> nn.Module:
    if weights == "int8":
        return Int8Linear(weight, bias)
    if weights == "float":
        return Linear(weight, bias)
    raise ValueError(f"weights must be 'float' or 'int8', got {weights!r}")
