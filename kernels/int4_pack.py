"""The int4 weights the native int4 kernel reads (kernels/csrc/int4_linear.h says the format and
why), made from floats or straight from a GGUF's 4-bit blocks, and read back for tests.

A weight is w = D * sc * q + Dm * m: q in 0..15; per block of 32 inputs an int8 sub-scale sc and an
int8 offset step m; per super-block of 256 inputs (the last one of a row 64, 128 or 192 long) an
fp16 scale D and an fp16 offset scale Dm. Two tensors per matrix [N, K]: records
[N, row_bytes(K)] uint8 and offset steps [N, K / 32] int8; ~4.63 bits a weight.

From GGUF (numpy, never through floats):
- Q4_K (w = d * sc_j * q - dmin * m_j): D = d, sc = sc_j, Dm = dmin, m = -m_j: every value kept.
- Q4_0 (w = d * (q - 8)): each block scale d becomes D * sc with an 8-bit sc (D = the super-block's
  largest |d| / 127); the offset -8 d is then exactly Dm * m with Dm = -8 D, m = sc.
- Q4_1 (w = d * q + o): d as for Q4_0; the fp16 offset o becomes Dm * m with an 8-bit m (Dm = the
  super-block's largest |o| / 127): the one rounding of a block's offset.
Any other tensor is quantized from its floats (`quantize_int4`).
"""
from __future__ import annotations

import numpy as np
import torch

SUPER = 256                 # inputs per fp16 scale D (the last super-block of a row may be shorter)
BLOCK = 32                  # inputs per sub-scale and offset step
CHUNK = 64                  # inputs per SIMD dot; K must be a multiple
FROM_BLOCKS = ("Q4_0", "Q4_1", "Q4_K")     # GGUF types packed from their blocks

Int4 = tuple[np.ndarray, np.ndarray]        # (records, offset steps)


def super_sizes(k: int) -> list[int]:
    if k % CHUNK:
        raise ValueError(f"int4 weights need in_features divisible by {CHUNK}, got {k}")
    return [SUPER] * (k // SUPER) + ([k % SUPER] if k % SUPER else [])


def row_bytes(k: int) -> int:
    return sum(w // 2 + w // BLOCK + 4 for w in super_sizes(k))


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


def pack(q: np.ndarray, d: np.ndarray, sc: np.ndarray, dm: np.ndarray, m: np.ndarray) -> Int4:
    """q [N, K] in 0..15, d and dm [N, super-blocks] (to fp16), sc and m [N, K / 32] int8."""
    n, k = q.shape
    d16, dm16 = d.astype(np.float16), dm.astype(np.float16)
    if not (np.isfinite(d16).all() and np.isfinite(dm16).all()):
        raise ValueError("an int4 super-block's scale or offset scale does not fit in fp16")
    q = q.astype(np.uint8)
    parts, start = [], 0
    for g, w in enumerate(super_sizes(k)):
        subscales = sc[:, start // BLOCK:(start + w) // BLOCK].astype(np.int8).view(np.uint8)
        scales = np.ascontiguousarray(np.stack([d16[:, g], dm16[:, g]], axis=1)).view(np.uint8)
        parts += [_nibbles(q[:, start:start + w]), subscales, scales]
        start += w
    return np.ascontiguousarray(np.concatenate(parts, axis=1)), np.ascontiguousarray(m.astype(np.int8))


def unpack(records: np.ndarray, steps: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
    """pack's inverse: (q [N, K] uint8, d [N, super-blocks] fp16, sc [N, K / 32] int8, dm fp16, m int8)."""
    n = records.shape[0]
    qs, ds, dms, scs, at = [], [], [], [], 0
    for w in super_sizes(k):
        nib = records[:, at:at + w // 2]
        pairs = w // 128
        pair = nib[:, :pairs * 64].reshape(n, pairs, 1, 64)
        qs.append(np.concatenate([pair & 0x0F, pair >> 4], axis=2).reshape(n, -1))
        if w % 128:
            tail = nib[:, pairs * 64:]
            qs.append(np.concatenate([tail & 0x0F, tail >> 4], axis=1))
        at_d = at + w // 2 + w // BLOCK                          # the super-block's D and Dm, after its sub-scales
        scs.append(records[:, at + w // 2:at_d].view(np.int8))
        ds.append(np.ascontiguousarray(records[:, at_d:at_d + 2]).view(np.float16))
        dms.append(np.ascontiguousarray(records[:, at_d + 2:at_d + 4]).view(np.float16))
        at += w // 2 + w // BLOCK + 4
    return (np.concatenate(qs, 1), np.concatenate(ds, 1), np.concatenate(scs, 1), np.concatenate(dms, 1),
            np.asarray(steps, np.int8))


def per_block(v: np.ndarray, k: int) -> np.ndarray:
    """A per-super-block value [N, super-blocks] repeated for each of its blocks: [N, K / 32]."""
    return np.repeat(v, [w // BLOCK for w in super_sizes(k)], axis=1)


def dequantize_int4(records: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """The float32 weights [N, K] that records and offset steps stand for."""
    k = steps.shape[1] * BLOCK
    q, d, sc, dm, m = unpack(records.cpu().numpy(), steps.cpu().numpy(), k)
    n = q.shape[0]
    s = per_block(d.astype(np.float32), k) * sc.astype(np.float32)
    o = per_block(dm.astype(np.float32), k) * m.astype(np.float32)      # exact: fp16 x int8 fits fp32
    w = q.reshape(n, -1, BLOCK).astype(np.float32) * s[..., None] + o[..., None]
    return torch.from_numpy(w.reshape(n, k))


def _super_scales(s: np.ndarray, k: int, ceil: bool) -> tuple[np.ndarray, np.ndarray]:
    """Block values s [N, K / 32] -> (D [N, super-blocks] fp16-exact float32, int8 c) with D * c ~ s:
    D = the super-block's largest |s| / 127 (rounded up in fp16), c rounded (`ceil`: rounded up)."""
    n = s.shape[0]
    sizes = [w // BLOCK for w in super_sizes(k)]
    bounds = np.cumsum([0] + sizes)
    peak = np.stack([np.abs(s[:, a:b]).max(1) for a, b in zip(bounds[:-1], bounds[1:])], axis=1)
    d = (peak / 127).astype(np.float16).astype(np.float32)
    d = np.where(d * 127 < peak, np.nextafter(d.astype(np.float16), np.float16(np.inf)).astype(np.float32), d)
    dblock = per_block(d, k)
    ratio = np.divide(s, dblock, out=np.zeros_like(s), where=dblock > 0)
    c = np.clip(np.ceil(ratio - 1e-6) if ceil else np.rint(ratio), -127, 127).astype(np.int8)
    return d.reshape(n, -1), c


def _offset_steps(o: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Block offsets o [N, K / 32] -> (Dm, m) with Dm * m <= o (never above: q stays >= 0) and
    within one step Dm = the super-block's largest |o| / 127."""
    dm, _ = _super_scales(o, k, ceil=False)
    step = per_block(dm, k)
    m = np.floor(np.divide(o, step, out=np.zeros_like(o), where=step > 0) + 1e-6)
    m = np.where(m * step > o, m - 1, m)                    # the 1e-6 slack must not land above o
    return dm, np.clip(m, -127, 127).astype(np.int8)


def quantize_int4(w: torch.Tensor | np.ndarray) -> Int4:
    """Int4 weights for floats [N, K]: per block the offset Dm * m at or just below the block's min,
    and the scale (max - offset) / 15 written as D * sc rounded up (so that q = round((w - offset) /
    (D * sc)) stays within 0..15)."""
    x = np.asarray(w.float().numpy() if isinstance(w, torch.Tensor) else w, dtype=np.float32)
    n, k = x.shape
    blocks = x.reshape(n, k // BLOCK, BLOCK)
    dm, m = _offset_steps(blocks.min(-1), k)
    low = per_block(dm, k) * m
    d, sc = _super_scales(((blocks.max(-1) - low) / 15).astype(np.float32), k, ceil=True)
    s = per_block(d, k) * sc
    safe = np.where(s > 0, s, 1)
    q = np.where(s[..., None] > 0, np.clip(np.rint((blocks - low[..., None]) / safe[..., None]), 0, 15), 0)
    return pack(q.reshape(n, k), d, sc, dm, m)


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
            return pack(q, dd, sc, -8 * dd, sc)
        dm, m = _super_scales(b[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32), k, ceil=False)
        return pack(q, dd, sc, dm, m)
    if kind == "Q4_K":
        b = raw.reshape(n, k // 256, 144)
        d = b[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        dmin = b[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        sc, m = _k4_scales(b[:, :, 4:16])                                   # [N, S, 8] each
        qs = b[:, :, 16:].reshape(n, k // 256, 4, 1, 32)
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=3).reshape(n, k)      # group j: low 64j + i, high 64j + 32 + i
        return pack(q, d, sc.reshape(n, -1).astype(np.int8), dmin, -m.reshape(n, -1))
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
