"""Rotary position embeddings as pure functions.

Terms: D = head_dim, R = rotary dims (R <= D: partial rotary rotates the first R of each head and
passes the rest), P = number of positions. We use the "rotate half" layout (the HF layout):
dimension i pairs with i + R/2. GGUF checkpoints of Llama store Q/K rows interleaved instead; the
GGUF loader undoes that permutation so that this one layout serves every checkpoint.

Scaling (config.RopeScaling): llama3 and linear change the frequencies; longrope has two sets of
frequencies, the short one for positions below `original_max_position` and the long one from there
on, chosen per position, so a token's rotation depends on its own position only (the batch
invariance every exactness law needs; it is also what HF's cached generation computes token by
token), and scales cos and sin by its attention factor.
"""
from __future__ import annotations

import math

import torch

from interlock.models.config import ModelConfig, RopeScaling


def inv_frequencies(rotary_dim: int, theta: float, scaling: RopeScaling | None = None,
                    long: bool = False) -> torch.Tensor:
    """[R/2] inverse frequencies, scaled as `scaling` says (longrope: the long set if `long`)."""
    inv = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    if scaling is None:
        return inv.float()
    if scaling.kind == "linear":
        return (inv / scaling.factor).float()
    if scaling.kind == "longrope":
        factors = torch.tensor(scaling.long_factor if long else scaling.short_factor, dtype=torch.float64)
        if factors.shape != inv.shape:
            raise ValueError(f"longrope needs {inv.shape[0]} factors, got {factors.shape[0]}")
        return (inv / factors).float()
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


def _table(angles: torch.Tensor, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.cat([angles, angles], dim=-1)             # [P, R]: each half repeated
    cos, sin = angles.cos(), angles.sin()
    return (cos * scale, sin * scale) if scale != 1.0 else (cos, sin)


def cos_sin_table(config: ModelConfig, inv_freq: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The global layers' cos, sin [P, R] for P = config.max_position (rotate-half layout).

    inv_freq: frequencies a checkpoint carries itself (a GGUF's llama3 rope_freqs) instead of config's.
    """
    pos = torch.arange(config.max_position, dtype=torch.float32)
    scaling = config.rope_scaling
    if inv_freq is not None or scaling is None or scaling.kind != "longrope":
        if inv_freq is None:
            inv_freq = inv_frequencies(config.rotary_dim, config.rope_theta, scaling)
        return _table(torch.outer(pos, inv_freq))
    short = torch.outer(pos, inv_frequencies(config.rotary_dim, config.rope_theta, scaling))
    long = torch.outer(pos, inv_frequencies(config.rotary_dim, config.rope_theta, scaling, long=True))
    angles = torch.where((pos < scaling.original_max_position)[:, None], short, long)
    return _table(angles, scaling.attention_factor)


def local_cos_sin_table(config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The sliding layers' own cos, sin [P, R] (base rope_local_theta, unscaled); None: they use the global ones."""
    if config.rope_local_theta <= 0:
        return None
    pos = torch.arange(config.max_position, dtype=torch.float32)
    return _table(torch.outer(pos, inv_frequencies(config.rotary_dim, config.rope_local_theta)))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D]; cos, sin: [T, R] for each token's position (R <= D). Returns the rotated x:
    its first R dims rotated, the others as they were."""
    r = cos.shape[-1]
    rot = x[..., :r]
    half = r // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    out = rot * cos[:, None, :] + rotated * sin[:, None, :]
    return out if r == x.shape[-1] else torch.cat([out, x[..., r:]], dim=-1)
