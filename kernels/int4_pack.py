"""The int4 weights the native int4 kernel reads (kernels/csrc/int4_linear.h says the format and
why), made from floats or straight from a GGUF's 4-bit blocks, and read back for tests.

A weight is w = D * sc * q + o: q in 0..15; per block of 32 inputs an int8 sub-scale sc and an
fp16 offset o; per super-block of 256 inputs (the last one of a row 64, 128 or 192 long) an fp16
scale D. Two tensors per matrix [N, K]: records [N, row_bytes(K)] uint8 and offsets [N, K / 32]
fp16; ~4.8 bits a weight.

From GGUF (numpy, a whole tensor at a time, never through floats):
- Q4_K (w = d * sc_j * q - dmin * m_j): D = d, sc = sc_j, the nibbles as they are; o = -dmin * m_j
  rounded to fp16 (relative error <= 2^-11).
- Q4_0 (w = d * (q - 8)) and Q4_1 (w = d * q + m): each block scale d becomes D * sc with an 8-bit
  sc (D = the super-block's largest |d| / 127); o = m exactly (Q4_1), or -8 * D * sc (Q4_0).
Any other tensor is quantized from its floats (`quantize_int4`).
"""
from __future__ import annotations

import numpy as np
import torch

SUPER = 256                 # inputs per fp16 scale D (the last super-block of a row may be shorter)
BLOCK = 32                  # inputs per sub-scale and offset
CHUNK = 64                  # inputs per SIMD dot; K must be a multiple
FROM_BLOCKS = ("Q4_0", "Q4_1", "Q4_K")     # GGUF types packed from their blocks

Int4 = tuple[np.ndarray, np.ndarray]        # (records, offsets)


def super_sizes(k: int) -> list[int]:
    if k % CHUNK:
        raise ValueError(f"int4 weights need in_features divisible by {CHUNK}, got {k}")
    return [SUPER] * (k // SUPER) + ([k % SUPER] if k % SUPER else [])


def row_bytes(k: int) -> int:
    return sum(w // 2 + w // BLOCK + 2 for w in super_sizes(k))


def _nibbles(q: np.ndarray) -> np.ndarray:
    """q [N, W] (one super-block's weights) -> its W / 2 bytes of nibbles: 64-weight chunks in pairs
    (byte i of a pair: weight i low, 64 + i high), a last unpaired chunk alone (i low, 32 + i high)."""
    n, w = q.shape
    pairs = w // 128
    out = [(q[:, :pairs * 128].reshape(n, pairs, 2, 64) * np.array([1, 16], np.uint8)[:, None]).sum(2, dtype=np.uint8)
           .reshape(n, -1)]
    if w % 128:
        tail = q[:, pairs * 128:].reshape(n, 2, 32)
        out.append(tail[:, 0] | (tail[:, 1] << 4))
    return np.concatenate(out, axis=1)


def pack(q: np.ndarray, d: np.ndarray, sc: np.ndarray, o: np.ndarray) -> Int4:
    """q [N, K] in 0..15, d [N, super-blocks] (to fp16), sc [N, K / 32] int8, o [N, K / 32] (to fp16)."""
    n, k = q.shape
    d16, o16 = d.astype(np.float16), o.astype(np.float16)
    if not (np.isfinite(d16).all() and np.isfinite(o16).all()):
        raise ValueError("an int4 super-block's scale or a block's offset does not fit in fp16")
    q = q.astype(np.uint8)
    parts, start = [], 0
    for g, w in enumerate(super_sizes(k)):
        subscales = sc[:, start // BLOCK:(start + w) // BLOCK].astype(np.int8).view(np.uint8)
        parts += [_nibbles(q[:, start:start + w]), subscales, np.ascontiguousarray(d16[:, g:g + 1]).view(np.uint8)]
        start += w
    return np.ascontiguousarray(np.concatenate(parts, axis=1)), np.ascontiguousarray(o16)


def unpack(records: np.ndarray, offsets: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """pack's inverse: (q [N, K] uint8, d [N, super-blocks] fp16, sc [N, K / 32] int8, o fp16)."""
    n = records.shape[0]
    qs, ds, scs, at = [], [], [], 0
    for w in super_sizes(k):
        nib = records[:, at:at + w // 2]
        pairs = w // 128
        pair = nib[:, :pairs * 64].reshape(n, pairs, 1, 64)
        qs.append(np.concatenate([pair & 0x0F, pair >> 4], axis=2).reshape(n, -1))
        if w % 128:
            tail = nib[:, pairs * 64:]
            qs.append(np.concatenate([tail & 0x0F, tail >> 4], axis=1))
        at_d = at + w // 2 + w // BLOCK                          # the super-block's D, after its sub-scales
        scs.append(records[:, at + w // 2:at_d].view(np.int8))
        ds.append(np.ascontiguousarray(records[:, at_d:at_d + 2]).view(np.float16))
        at += w // 2 + w // BLOCK + 2
    return np.concatenate(qs, 1), np.concatenate(ds, 1), np.concatenate(scs, 1), np.asarray(offsets, np.float16)


def dequantize_int4(records: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The float32 weights [N, K] that records and offsets stand for."""
    k = offsets.shape[1] * BLOCK
    q, d, sc, o = unpack(records.cpu().numpy(), offsets.cpu().numpy(), k)
    n = q.shape[0]
    dblock = np.repeat(d.astype(np.float32), [w // BLOCK for w in super_sizes(k)], axis=1)     # [N, K / 32]
    s = dblock * sc.astype(np.float32)
    w = q.reshape(n, -1, BLOCK).astype(np.float32) * s[..., None] + o.astype(np.float32)[..., None]
    return torch.from_numpy(w.reshape(n, k))


def _super_scales(s: np.ndarray, k: int, ceil: bool) -> tuple[np.ndarray, np.ndarray]:
    """Block scales s [N, K / 32] -> (D [N, super-blocks] fp16-exact float32, sc int8) with D * sc ~ s:
    D = the super-block's largest |s| / 127 (rounded up in fp16), sc rounded (or rounded up: `ceil`)."""
    n = s.shape[0]
    sizes = [w // BLOCK for w in super_sizes(k)]
    bounds = np.cumsum([0] + sizes)
    peak = np.stack([np.abs(s[:, a:b]).max(1) for a, b in zip(bounds[:-1], bounds[1:])], axis=1)
    d = (peak / 127).astype(np.float16).astype(np.float32)
    d = np.where(d * 127 < peak, np.nextafter(d.astype(np.float16), np.float16(np.inf)).astype(np.float32), d)
    dblock = np.repeat(d, sizes, axis=1)
    ratio = np.divide(s, dblock, out=np.zeros_like(s), where=dblock > 0)
    sc = np.clip(np.ceil(ratio - 1e-6) if ceil else np.rint(ratio), -127, 127).astype(np.int8)
    return d.reshape(n, -1), sc


def quantize_int4(w: torch.Tensor | np.ndarray) -> Int4:
    """Int4 weights for floats [N, K]: per block o = min (fp16) and scale (max - o) / 15, written
    as D * sc rounded up (so that q = round((w - o) / (D * sc)) stays within 0..15)."""
    x = np.asarray(w.float().numpy() if isinstance(w, torch.Tensor) else w, dtype=np.float32)
    n, k = x.shape
    blocks = x.reshape(n, k // BLOCK, BLOCK)
    least = blocks.min(-1)
    low = least.astype(np.float16)                            # rounded down where fp16 rounding went past the min
    low = np.where(low.astype(np.float32) > least, np.nextafter(low, np.float16(-np.inf)), low).astype(np.float32)
    d, sc = _super_scales(((blocks.max(-1) - low) / 15).astype(np.float32), k, ceil=True)
    s = np.repeat(d, [s // BLOCK for s in super_sizes(k)], axis=1) * sc
    safe = np.where(s > 0, s, 1)
    q = np.where(s[..., None] > 0, np.clip(np.rint((blocks - low[..., None]) / safe[..., None]), 0, 15), 0)
    return pack(q.reshape(n, k), d, sc, low)


def from_gguf(data: np.ndarray, kind: str, n: int, k: int) -> Int4:
    """Int4 weights for a GGUF tensor of type `kind` (one of FROM_BLOCKS): `data` is the reader's raw
    uint8 blocks, `n` x `k` its shape (rows x inputs)."""
    raw = np.ascontiguousarray(data).reshape(n, -1)
    if kind in ("Q4_0", "Q4_1"):
        size = 18 if kind == "Q4_0" else 20
        b = raw.reshape(n, k // BLOCK, size)
        d = b[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        qs = b[:, :, size - 16:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, k)      # weight j: low of j, j + 16: high
        dd, sc = _super_scales(d, k, ceil=False)
        if kind == "Q4_0":          # centred on the rounded scale: the rounding error then scales with |q - 8|
            off = -8 * np.repeat(dd, [w // BLOCK for w in super_sizes(k)], axis=1) * sc
        else:
            off = b[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        return pack(q, dd, sc, off)
    if kind == "Q4_K":
        b = raw.reshape(n, k // 256, 144)
        d = b[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        dmin = b[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        sc, m = _k4_scales(b[:, :, 4:16])                                   # [N, S, 8] each
        qs = b[:, :, 16:].reshape(n, k // 256, 4, 1, 32)
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=3).reshape(n, k)      # group j: low 64j + i, high 64j + 32 + i
        return pack(q, d, sc.reshape(n, -1).astype(np.int8), -(dmin[..., None] * m).reshape(n, -1))
    raise ValueError(f"no block packing for {kind} (packed from blocks: {', '.join(FROM_BLOCKS)})")


def _k4_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 scale bytes -> the 8 sub-blocks' 6-bit scales and mins."""
    s = s.astype(np.uint8)
    sc = np.empty(s.shape[:-1] + (8,), dtype=np.uint8)
    m = np.empty_like(sc)
    sc[..., :4] = s[..., 0:4] & 63
    m[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)
    m[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, m.astype(np.float32)
