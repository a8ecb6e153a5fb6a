"""Torch reference ops for the device forward on the CPU: what CI runs where CUDA runs
models/triton_ops.py. Same signatures, same row-by-row semantics.

Terms as in triton_ops.py: T rows, E hidden, Hkv KV heads, G query heads per KV head, D head
dim, S KV block size, MB blocks per table, C = MB * S context slots a table can address.

Each row is computed from that row's data alone, with shapes that depend on nothing but the
tables' width (fixed for an engine), so a row's result is the same whatever rows surround it (the
batch invariance the exactness laws need). Nothing reads a value on the host: the ops are the
same whether they run at once, deferred on a lane (streams/cuda_rules.py) or replayed from a
captured program. The attention attends over all C slots of a row's table and masks those past
its position: simple and fixed-shape, at the cost of C per row (tests keep C small).

Each op first checks what its Triton kernel assumes (models/kernel_rules.py: contiguous inputs,
dtypes, block sizes) and raises `KernelInputError` where the kernel would silently misread: a
stride the reference would honour is a wrong answer on the GPU.
"""
from __future__ import annotations

import torch

from interlock.models.kernel_rules import check_paged_attention, check_rms_norm


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, E] -> [T, E] in x's dtype; fp32 statistics, as the Triton kernel."""
    check_rms_norm(x, weight)
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype).float()
    return (y * weight.float()).to(x.dtype)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                    row_table: torch.Tensor, positions: torch.Tensor, n_kv_heads: int,
                    block_size: int, scale: float | None = None, window: int = 0) -> torch.Tensor:
    """q [T, H*D] (RoPE applied), caches [slots, Hkv, D], tables [tables, MB] int32, row_table [T]
    (the table of each row), positions [T] -> [T, H*D]: each row attends over positions 0..its own
    (K/V already written), or with a sliding window W > 0 over its last W positions; scores scaled
    by `scale` (None: D ** -0.5)."""
    check_paged_attention(q, k_cache, v_cache, tables, row_table, positions, n_kv_heads)
    n_rows, q_size = q.shape
    d = k_cache.shape[-1]
    g = q_size // d // n_kv_heads
    scale = d ** -0.5 if scale is None else scale
    n = torch.arange(tables.shape[1] * block_size, device=q.device)                       # [C]
    blocks = tables.index_select(0, row_table).long()                                    # [T, MB]
    slots = blocks.index_select(1, n // block_size) * block_size + n % block_size       # [T, C]
    k = k_cache[slots].float()                                                           # [T, C, Hkv, D]
    v = v_cache[slots].float()
    qt = q.view(n_rows, n_kv_heads, g, d).float()                                        # [T, Hkv, G, D]
    # products and sums, not einsum: a batched GEMM's blocking (and so its rounding) may change with T
    scores = (qt.unsqueeze(3) * k.permute(0, 2, 1, 3).unsqueeze(2)).sum(-1) * scale      # [T, Hkv, G, C]
    hidden = n.unsqueeze(0) > positions.unsqueeze(1)                                    # [T, C]: the future
    if window:
        hidden |= n.unsqueeze(0) <= (positions - window).unsqueeze(1)                  # and past the window
    weights = scores.masked_fill(hidden.view(n_rows, 1, 1, -1), float("-inf")).softmax(-1)
    # hidden slots hold anything (another sequence's K/V, NaN after a fault): a zero weight times
    # NaN is NaN, so their values are zeroed, not just weighted by 0
    v = v.masked_fill(hidden.view(n_rows, -1, 1, 1), 0.0)
    out = (weights.unsqueeze(-1) * v.permute(0, 2, 1, 3).unsqueeze(2)).sum(3)          # [T, Hkv, G, D]
    return out.reshape(n_rows, q_size).to(q.dtype)
