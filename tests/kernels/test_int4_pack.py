"""GGUF 4-bit blocks packed into int4 (kernels/int4_pack.py) against the `gguf` package's own reading of
the same blocks: Q4_K's values kept (its offsets rounded to fp16), Q4_0 / Q4_1's within an 8-bit
sub-scale of theirs."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import quants

from interlock.kernels.int4_pack import dequantize_int4, from_gguf, pack, row_bytes, super_sizes, unpack


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def random_q4_k(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Valid Q4_K blocks with random nibbles, 6-bit scales and mins (gguf cannot quantize Q4_K)."""
    blocks = rng.integers(0, 256, size=(n, k // 256, 144), dtype=np.uint8)
    blocks[:, :, 0:2] = rng.uniform(0.001, 0.02, size=(n, k // 256, 1)).astype(np.float16).view(np.uint8)   # d
    blocks[:, :, 2:4] = rng.uniform(0.0005, 0.01, size=(n, k // 256, 1)).astype(np.float16).view(np.uint8)  # dmin
    return blocks.reshape(n, -1)


def test_q4_k_blocks_keep_their_values(rng) -> None:
    n, k = 6, 512
    data = random_q4_k(n, k, rng)
    ref = quants.dequantize(data, gguf.GGMLQuantizationType.Q4_K).reshape(n, k)
    records, offsets = from_gguf(data, "Q4_K", n, k)
    got = dequantize_int4(torch.from_numpy(records), torch.from_numpy(offsets)).numpy()
    # q and D * sc are Q4_K's own; only each block's offset dmin * m is rounded to fp16
    o = np.abs(offsets.astype(np.float32)).repeat(32, axis=1)
    assert (np.abs(got - ref) <= o * 2 ** -11 + 1e-9).all()


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
@pytest.mark.parametrize("k", [256, 576, 640])
def test_q4_0_and_q4_1_within_an_8_bit_sub_scale(kind, k, rng) -> None:
    n = 5
    w = rng.standard_normal((n, k)).astype(np.float32) * np.logspace(-2, 0, n, dtype=np.float32)[:, None]
    data = quants.quantize(w, getattr(gguf.GGMLQuantizationType, kind))
    ref = quants.dequantize(data, getattr(gguf.GGMLQuantizationType, kind)).reshape(n, k)
    records, offsets = from_gguf(data, kind, n, k)
    assert records.shape == (n, row_bytes(k)) and offsets.shape == (n, k // 32)
    got = dequantize_int4(torch.from_numpy(records), torch.from_numpy(offsets)).numpy()
    # the block scale d becomes D * sc with D = the super-block's largest |d| / 127: an error of at
    # most D / 2 on the scale, times q <= 15 (Q4_1, whose offset m is exact) or |q - 8| <= 8 (Q4_0,
    # whose offset is -8 D sc, rounded to fp16)
    d = np.abs(np.ascontiguousarray(data.reshape(n, k // 32, -1)[:, :, 0:2]).view(np.float16)[..., 0].astype(np.float32))
    bounds = np.cumsum([0] + [s // 32 for s in super_sizes(k)])
    peak = np.concatenate([np.repeat(d[:, a:b].max(1, keepdims=True), b - a, 1) for a, b in zip(bounds[:-1], bounds[1:])], 1)
    allowed = peak / 127 / 2 * (8 if kind == "Q4_0" else 15) * 1.01 + 8 * peak * 2 ** -11 + 1e-7
    assert (np.abs(got - ref).reshape(n, -1, 32).max(-1) <= allowed).all()


def test_pack_and_unpack_are_inverses(rng) -> None:
    n, k = 3, 704                                      # 2 super-blocks and a 192-weight tail
    q = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    d = rng.uniform(0.001, 0.1, size=(n, len(super_sizes(k)))).astype(np.float16)
    sc = rng.integers(-127, 128, size=(n, k // 32)).astype(np.int8)
    o = rng.standard_normal((n, k // 32)).astype(np.float16)
    back = unpack(*pack(q, d, sc, o), k)
    for a, b in zip((q, d, sc, o), back):
        assert np.array_equal(a, b)


def test_a_scale_beyond_fp16_is_refused(rng) -> None:
    with pytest.raises(ValueError, match="fp16"):
        pack(np.zeros((1, 64), np.uint8), np.array([[1e6]], np.float32), np.zeros((1, 2), np.int8),
             np.zeros((1, 2), np.float32))
