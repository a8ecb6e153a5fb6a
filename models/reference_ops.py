"""Torch reference ops for the device forward on the CPU: what CI runs where CUDA runs
models/triton_ops.py. Same signatures, same row-by-row semantics.

Terms as in triton_ops.py: T rows, E hidden, Hkv KV heads, G query heads per KV head, D head
dim, S KV block size, L = a row's context length (its position + 1).

Each row is computed from that row's data alone, with shapes that depend on nothing but its own
L, so a row's result is the same whatever rows surround it (the batch invariance the exactness
laws need). The attention loops over rows in Python: slow, obvious, and for tests.
"""
from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, E] -> [T, E] in x's dtype; fp32 statistics, as the Triton kernel."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype).float()
    return (y * weight.float()).to(x.dtype)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                    positions: torch.Tensor, n_kv_heads: int, block_size: int, scale: float | None = None,
                    window: int = 0) -> torch.Tensor:
    """q [T, H*D] (RoPE applied), caches [slots, Hkv, D], tables [T, max blocks], positions [T]
    -> [T, H*D]: each row attends over positions 0..its own (K/V already written), or with a
    sliding window W > 0 over its last W positions; scores scaled by `scale` (None: D ** -0.5)."""
    n_rows, q_size = q.shape
    d = k_cache.shape[-1]
    g = q_size // d // n_kv_heads
    scale = d ** -0.5 if scale is None else scale
    out = torch.empty_like(q)
    for t, pos in enumerate(positions.tolist()):
        n = torch.arange(max(0, pos + 1 - window) if window else 0, pos + 1)
        slots = tables[t, n // block_size].long() * block_size + n % block_size         # [L]
        k, v = k_cache[slots].float(), v_cache[slots].float()                            # [L, Hkv, D]
        qt = q[t].view(n_kv_heads, g, d).float()                                         # [Hkv, G, D]
        scores = torch.einsum("hgd,lhd->hgl", qt, k) * scale                             # [Hkv, G, L]
        out[t] = torch.einsum("hgl,lhd->hgd", scores.softmax(-1), v).reshape(q_size).to(q.dtype)
    return out
