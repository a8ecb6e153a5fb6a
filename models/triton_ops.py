"""Row-independent Triton ops for the CUDA forward (models/device_llama.py).

Terms: T rows (one new token each), E hidden, Hkv KV heads, G = query heads per KV head,
D head dim, S KV block size, L = a row's context length (its position + 1).

Each op computes a row from that row's data alone, in a fixed order that does not depend on T:
- rms_norm: one program per row, one reduction over E.
- paged_attention: one program per (row, KV head); the row's G query heads (padded to 16 for
  tl.dot) attend over its own L keys (with a sliding window W, its last W), read through its block
  table in blocks of BLOCK_N keys from the first it sees, with an online softmax. A row of a
  verify chunk re-reads the context its neighbours read: the price of being bitwise equal to the
  same row decoded alone.
A head dim that is not a power of two (Phi-3's 96) runs padded to the next one (D_PAD) with the
padding lanes masked: `tl.arange` needs a power of two. What each kernel assumes of its inputs
(contiguous, dtypes) is checked before launch by models/kernel_rules.py, the same checks the torch
references run on the CPU. Fixed grids for fixed T, no host syncs: safe inside CUDA graphs.
Imported only on CUDA.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from interlock.models.kernel_rules import check_paged_attention, check_rms_norm


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, E, eps, BLOCK_E: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    x = tl.load(x_ptr + row * E + cols, mask=cols < E, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / E + eps)
    w = tl.load(w_ptr + cols, mask=cols < E, other=0.0).to(tl.float32)
    y = (x * rstd).to(out_ptr.dtype.element_ty).to(tl.float32) * w     # as rms_norm: weight * x_normed.to(dtype)
    tl.store(out_ptr + row * E + cols, y.to(out_ptr.dtype.element_ty), mask=cols < E)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, E] (contiguous) -> [T, E] in x's dtype; fp32 statistics."""
    check_rms_norm(x, weight)
    out = torch.empty_like(x)
    e = x.shape[1]
    if x.shape[0]:
        _rms_norm_kernel[(x.shape[0],)](x, weight, out, e, eps, BLOCK_E=triton.next_power_of_2(e),
                                        num_warps=8 if e >= 2048 else 4)
    return out


@triton.jit
def _paged_attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, row_table_ptr, pos_ptr, scale, window,
                            q_stride, kv_stride, tables_stride, block_size,
                            G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
                            BLOCK_N: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    n_ctx = tl.load(pos_ptr + t) + 1
    table = tl.load(row_table_ptr + t)                                 # the row of `tables` holding its blocks
    first = tl.maximum(n_ctx - window, 0)                              # the first key the row sees
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    dm = d < D                                                         # [D_PAD]: the real head dims
    heads = h * G + g                                                  # [G_PAD] query heads
    q_mask = (g < G)[:, None] & dm[None, :]
    q = tl.load(q_ptr + t * q_stride + heads[:, None] * D + d[None, :], mask=q_mask, other=0.0)
    m = tl.full((G_PAD,), float("-inf"), tl.float32)
    l_sum = tl.zeros((G_PAD,), tl.float32)
    acc = tl.zeros((G_PAD, D_PAD), tl.float32)
    for start in range(first, n_ctx, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        valid = n < n_ctx
        block = tl.load(tables_ptr + table * tables_stride + n // block_size, mask=valid, other=0).to(tl.int64)
        slot = block * block_size + n % block_size                     # [BLOCK_N]
        offs = slot[:, None] * kv_stride + h * D + d[None, :]          # [BLOCK_N, D_PAD]
        kv_mask = valid[:, None] & dm[None, :]                         # padded dims read 0: no score change
        k = tl.load(k_ptr + offs, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale                             # [G_PAD, BLOCK_N] fp32
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + offs, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    out = acc / l_sum[:, None]
    tl.store(out_ptr + t * q_stride + heads[:, None] * D + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=q_mask)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                    row_table: torch.Tensor, positions: torch.Tensor, n_kv_heads: int, block_size: int,
                    scale: float | None = None, window: int = 0) -> torch.Tensor:
    """q [T, H*D] (RoPE applied), caches [slots, Hkv, D], tables [tables, max blocks] int32, row_table
    [T] int64 (the table of each row), positions [T] -> [T, H*D]: each row attends over positions
    0..its own (K/V already written), or with a sliding window W > 0 over its last W positions;
    scores scaled by `scale` (None: D ** -0.5)."""
    blocks = check_paged_attention(q, k_cache, v_cache, tables, row_table, positions, n_kv_heads)
    n_rows, q_size = q.shape
    head_dim = k_cache.shape[-1]
    g = q_size // head_dim // n_kv_heads
    out = torch.empty_like(q)
    if n_rows:
        _paged_attention_kernel[(n_rows, n_kv_heads)](
            q, k_cache, v_cache, out, tables, row_table, positions, head_dim ** -0.5 if scale is None else scale,
            window if window > 0 else 2 ** 30,
            q.stride(0), k_cache.stride(0), tables.stride(0), block_size,
            G=g, G_PAD=blocks.g_pad, D=head_dim, D_PAD=blocks.d_pad, BLOCK_N=blocks.block_n, num_warps=4)
    return out
