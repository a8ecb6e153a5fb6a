"""What the Triton row ops (models/triton_ops.py) assume of their inputs, checked in one place.

A Triton kernel reads raw pointers: it knows a tensor's address and the strides it is passed, and
nothing else. A strided view handed where the kernel adds `ptr + t` is read as if contiguous (the
wrong elements, silently); a `tl.arange(0, N)` needs N a power of two; `tl.dot` needs both sides
of one dtype and a reduction of at least 16. The torch references (models/reference_ops.py) honour
strides and any size, so a CPU test would never see such a misread. Both therefore call these
checks: the references raise `KernelInputError` exactly where the kernel would misread, and the
kernels' wrappers size their blocks with `attention_blocks`, so a CPU test predicts the GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from interlock.protocol.errors import UnsupportedModelError

BLOCK_N = 64            # keys per block of the attention's online softmax
MAX_HEAD_DIM = 256      # beyond it one program's [G_PAD, D_PAD] tiles no longer fit in registers
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


class KernelInputError(ValueError):
    """An input a Triton kernel would misread (a strided view, a wrong dtype, a bad shape)."""


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class AttentionBlocks:
    """The paged attention's compile-time block sizes (each a power of two, as tl.arange needs)."""

    g_pad: int      # query heads per KV head, padded (>= 16 for tl.dot)
    d_pad: int      # head dim, padded and masked (Phi-3's 96 runs as 128)
    block_n: int = BLOCK_N


def attention_blocks(group: int, head_dim: int) -> AttentionBlocks:
    """The blocks for G query heads per KV head of dim D; UnsupportedModelError past MAX_HEAD_DIM."""
    if group < 1 or head_dim < 1:
        raise KernelInputError(f"attention needs G >= 1 and D >= 1, got G={group}, D={head_dim}")
    if head_dim > MAX_HEAD_DIM:
        raise UnsupportedModelError(f"the device attention supports head_dim <= {MAX_HEAD_DIM}, got {head_dim}")
    return AttentionBlocks(max(16, next_power_of_2(group)), max(16, next_power_of_2(head_dim)))


def _contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise KernelInputError(f"{name} must be contiguous (the kernel adds raw offsets), got shape "
                               f"{tuple(t.shape)} with strides {t.stride()}: pass .contiguous()")


def _dtype(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    if t.dtype not in allowed:
        raise KernelInputError(f"{name} must be {' or '.join(map(str, allowed))}, got {t.dtype}")


def check_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> None:
    """x [T, E] contiguous (row r at r * E), weight [E] contiguous, both floats."""
    if x.dim() != 2 or weight.shape != (x.shape[1],):
        raise KernelInputError(f"rms_norm needs x [T, E] and weight [E], got {tuple(x.shape)}, {tuple(weight.shape)}")
    for name, t in (("x", x), ("weight", weight)):
        _contiguous(f"rms_norm's {name}", t)
        _dtype(f"rms_norm's {name}", t, FLOATS)


def check_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                          row_table: torch.Tensor, positions: torch.Tensor, n_kv_heads: int) -> AttentionBlocks:
    """What `_paged_attention_kernel` reads: q [T, H*D], caches [slots, Hkv, D] of q's dtype, tables
    [S, MB] int32, row_table and positions [T] int64, all contiguous; returns its block sizes."""
    if q.dim() != 2 or k_cache.dim() != 3 or k_cache.shape != v_cache.shape or k_cache.shape[1] != n_kv_heads:
        raise KernelInputError(f"paged_attention needs q [T, H*D] and caches [slots, {n_kv_heads}, D], got "
                               f"{tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    head_dim = k_cache.shape[2]
    if q.shape[1] % (n_kv_heads * head_dim):
        raise KernelInputError(f"q's width {q.shape[1]} is not a multiple of Hkv * D = {n_kv_heads * head_dim}")
    rows = q.shape[0]
    for name, t, dtypes in (("q", q, FLOATS), ("k_cache", k_cache, (q.dtype,)), ("v_cache", v_cache, (q.dtype,)),
                            ("tables", tables, (torch.int32,)), ("row_table", row_table, (torch.int64,)),
                            ("positions", positions, (torch.int64,))):
        _contiguous(f"paged_attention's {name}", t)
        _dtype(f"paged_attention's {name}", t, dtypes)
    for name, t in (("row_table", row_table), ("positions", positions)):
        if t.shape != (rows,):
            raise KernelInputError(f"paged_attention's {name} must be [{rows}], got {tuple(t.shape)}")
    if tables.dim() != 2:
        raise KernelInputError(f"paged_attention's tables must be [S, MB], got {tuple(tables.shape)}")
    return attention_blocks(q.shape[1] // head_dim // n_kv_heads, head_dim)
