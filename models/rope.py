"""Rotary position embeddings as pure functions.

Terms: D = head_dim, P = number of positions. We use the "rotate half" layout (the HF layout):
dimension i pairs with i + D/2. GGUF checkpoints store Q/K rows interleaved instead; the GGUF
loader undoes that permutation so that this one layout serves every checkpoint.
"""
from __future__ import annotations

import math

import torch

from interlock.models.config import ModelConfig, RopeScaling


def inv_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """[D/2] inverse frequencies, with llama3 scaling applied when given."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling is None:
        return inv.float()
    # llama3: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    low_wavelen = scaling.original_max_position / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv
    smooth = (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * inv / scaling.factor + smooth * inv
    out = torch.where(wavelen > low_wavelen, inv / scaling.factor, blended)
    out = torch.where(wavelen < high_wavelen, inv, out)
    return out.float()


def cos_sin_table(config: ModelConfig, inv_freq: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [P, D] for P = config.max_position (each half repeated, rotate-half layout)."""
    if inv_freq is None:
        inv_freq = inv_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
    pos = torch.arange(config.max_position, dtype=torch.float32)
    angles = torch.outer(pos, inv_freq)                      # [P, D/2]
    angles = torch.cat([angles, angles], dim=-1)             # [P, D]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D]; cos, sin: [T, D] for each token's position. Returns the rotated x."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
