"""The native CPU kernels against their float64 references, and their row independence."""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from fractions import Fraction

import pytest
import torch

from interlock.kernels import native

needs_native = pytest.mark.skipif(not native.available(), reason="no C++ compiler: native kernels not built")


def test_builds_where_a_compiler_exists() -> None:
    # The skip below must never hide a broken build: with a compiler on PATH it has to build.
    if shutil.which("c++") or shutil.which("g++"):
        assert native.available()


@needs_native
@pytest.mark.parametrize(("m", "n", "k"), [(1, 4, 32), (1, 7, 96), (3, 9, 32), (4, 64, 576), (5, 13, 1536),
                                           (8, 130, 64), (11, 6, 160), (16, 40, 576), (37, 21, 160),
                                           (70, 33, 96)])      # 96, 160: a half chunk at the end
def test_int8_linear_matches_reference(m: int, n: int, k: int, gen: torch.Generator) -> None:
    x = torch.randn(m, k, generator=gen)
    x[0, :32] = 0.0                               # an all-zero block: scale 0
    x[-1, 5] = 40.0                               # an outlier: its block's other values lose precision
    q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)     # -128: AVX2 reads |w| unsigned
    scale = torch.rand(n, generator=gen) * 0.1
    y = native.int8_linear(x, q, scale, backend="native")
    ref = native.int8_linear(x, q, scale, backend="reference")
    assert y.dtype == torch.float32 and y.shape == (m, n)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-4)
    # Each row alone is bit-identical to the same row in the batch: what speculative decoding needs.
    for r in range(m):
        assert torch.equal(native.int8_linear(x[r: r + 1], q, scale, backend="native")[0], y[r])
    # And any slice of rows (a verify step's few rows vs a prompt chunk's many: different kernels).
    for r0, r1 in ((0, min(m, 4)), (m // 3, m), (1, m)):
        if r1 > r0:
            assert torch.equal(native.int8_linear(x[r0: r1], q, scale, backend="native"), y[r0: r1]), (r0, r1)


@needs_native
def test_int8_linear_vnni_kernel_where_amx_runs() -> None:
    # On an AMX machine the tests above run the tile kernel (and its one-row VNNI companion); the
    # plain VNNI kernel, what a CPU without AMX runs, gets the same checks in a process with AMX off.
    if native.int8_kernel() != "amx":
        pytest.skip(f"this process already runs the {native.int8_kernel()} kernel")
    env = {**os.environ, "INTERLOCK_AMX": "0"}
    check = "from interlock.kernels import native; assert native.int8_kernel() == 'vnni'"
    subprocess.run([sys.executable, "-c", check], env=env, check=True)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                           "-k", "int8_linear_matches_reference"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:]


def _f32(v: Fraction) -> float:
    """v rounded to the nearest fp32 (ties to even): one correctly rounded fp32 operation."""
    if v == 0:
        return 0.0          # the sums here: lanes start at +0 and only add, so no -0 arises
    mag = abs(v)
    e = mag.numerator.bit_length() - mag.denominator.bit_length()
    if mag < Fraction(2) ** e:
        e -= 1                                    # now 2^e <= |v| < 2^(e + 1)
    step = max(e, -126) - 23                      # fp32's ulp there (subnormals: 2^-149)
    r = round(mag / Fraction(2) ** step)          # Fraction's round: half to even
    out = math.ldexp(r, step)
    return math.copysign(out if out < 2.0 ** 128 else math.inf, v)


def int8_linear_exact(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """What the native int8_linear computes, emulated exactly (csrc/int8_linear.h, "The arithmetic"):
    per block b the exact integer dot d_b, lane b % 4 += fp32 fma(d_b, s_b), in block order, then
    ((l0 + l1) + (l2 + l3)) * scale, every step rounded once to fp32. Finite inputs only."""
    values, scales = native.quantize_activations(x)
    m, k = x.shape
    blocks = k // native.ACT_BLOCK
    dots = torch.einsum("mbi,nbi->mnb", values.long().reshape(m, blocks, -1), q.long().reshape(-1, blocks, native.ACT_BLOCK))
    y = torch.empty(m, q.shape[0])
    for i in range(m):
        s = [Fraction(v) for v in scales[i].tolist()]
        for n in range(q.shape[0]):
            lanes = [0.0] * 4
            for b, d in enumerate(dots[i, n].tolist()):
                lanes[b % 4] = _f32(d * s[b] + Fraction(lanes[b % 4]))
            left, right = _f32(Fraction(lanes[0]) + Fraction(lanes[1])), _f32(Fraction(lanes[2]) + Fraction(lanes[3]))
            y[i, n] = _f32(Fraction(left) + Fraction(right))
    return y * scale.float()                      # fp32's multiply: a zero times a negative scale is -0


def test_f32_rounds_as_fp32_does(gen: torch.Generator) -> None:
    # The emulation's rounding against torch's fp32 on single operations (correctly rounded there).
    a, b = torch.randn(200, generator=gen) * 1e3, torch.randn(200, generator=gen) * 1e-2
    for x, y in zip(a.tolist(), b.tolist(), strict=True):
        assert _f32(Fraction(x) + Fraction(y)) == float(torch.tensor(x) + torch.tensor(y))
        assert _f32(Fraction(x) * Fraction(y)) == float(torch.tensor(x) * torch.tensor(y))
    assert _f32(Fraction(1) + Fraction(2) ** -24) == 1.0                      # a tie: to even
    assert _f32(Fraction(1) + Fraction(3) * Fraction(2) ** -24) == 1.0 + 2.0 ** -22
    assert _f32(Fraction(2) ** -149 * Fraction(3, 4)) == 2.0 ** -149          # subnormal
    assert _f32(-Fraction(2) ** 128) == -math.inf


@needs_native
@pytest.mark.parametrize(("m", "n", "k"), [(1, 6, 96), (1, 9, 576), (4, 20, 160), (3, 17, 576), (13, 18, 96),
                                           (17, 5, 288)])
def test_int8_linear_is_its_documented_arithmetic_bit_for_bit(m: int, n: int, k: int, gen: torch.Generator) -> None:
    # Whichever kernel this machine runs (on AMX: one row on VNNI, 2-11 rows in a tile pass, 12+ in
    # the many-row tile kernel), each output is the emulated arithmetic's bits: the lanes, their
    # order and the final tree, which no tolerance could tell apart.
    x = torch.randn(m, k, generator=gen) * torch.logspace(-2, 2, m)[:, None]
    x[0, :32] = 0.0
    q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    scale = torch.rand(n, generator=gen) * 0.1 - 0.02               # a negative output scale too
    y = native.int8_linear(x, q, scale, backend="native")
    assert torch.equal(y.view(torch.int32), int8_linear_exact(x, q, scale).view(torch.int32))


# Runs in a child process (the kernel is chosen once per process): int8_linear and the sparse
# head over the cases in argv[1], results to argv[2].
_KERNEL_RUN = """
import sys, torch
from interlock.kernels import native
cases = torch.load(sys.argv[1])
out = [native.int8_linear(x, q, s, backend="native") for x, q, s in cases["linear"]]
x, q, s, bitmask, rows = cases["head"]
out += list(native.head_argmax(x, q, s, bitmask, rows, q.shape[0], 8))
torch.save({"kernel": native.int8_kernel(), "out": out}, sys.argv[2])
"""

# Each kernel's process settings (kernels/native.py): the machine's best (AMX where it has the
# tiles), VNNI with AMX off, AVX2 with AVX-512 compiled out, and the portable C++.
_KERNEL_ENVS = {"amx": {}, "vnni": {"INTERLOCK_AMX": "0"}, "avx2": {"INTERLOCK_SIMD": "avx2"},
                "portable": {"INTERLOCK_SIMD": "0"}}


def _int8_cases(gen: torch.Generator) -> dict:
    """Shapes every path of every kernel runs: 1 row (VNNI's lane sums; on AMX too), 2-3 (VNNI's
    lane sums, AMX's tile pass), 4 (VNNI's transposed tile, one pass), 5+ (its stored tile, several
    passes), 12+ (AMX's many-row kernel), K with a half chunk (32, 96, 160) or an odd number of
    chunks (576), N not a multiple of 4 or 16; NaN and infinite activations."""
    cases = {"linear": [], "head": None}
    for m, n, k in ((1, 64, 576), (1, 13, 96), (1, 7, 160), (2, 9, 1536), (4, 40, 160), (3, 7, 32), (5, 21, 576),
                    (4, 19, 576), (11, 16, 64), (12, 17, 96), (17, 33, 576), (19, 24, 96), (40, 8, 96)):
        x = torch.randn(m, k, generator=gen) * torch.logspace(-3, 3, m)[:, None]
        x[0, :32] = 0.0
        q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
        q[0] = -128                                # the one byte whose |w| needs 8 bits (AVX2)
        cases["linear"].append((x, q, torch.rand(n, generator=gen) * 0.1))
    for m in (1, 2, 16):                           # one-row, tile pass and many-row paths
        nan_row = torch.randn(m, 64, generator=gen)
        nan_row[-1, 3] = float("nan")
        cases["linear"].append((nan_row, torch.randint(-128, 128, (5, 64), generator=gen, dtype=torch.int8),
                                torch.ones(5)))
        odd_row = torch.randn(m + 2, 64, generator=gen)
        odd_row[0, 5] = float("inf")               # an infinite block scale: its 0 * inf lanes convert from NaN
        odd_row[-1, 40] = torch.tensor(-0x3FFEDD, dtype=torch.int32).view(torch.float32)   # a NaN with a payload
        cases["linear"].append((odd_row, torch.randint(-128, 128, (5, 64), generator=gen, dtype=torch.int8),
                                torch.ones(5)))
    # no rows at all (a head with no row to score): an empty result, not rows 0 .. 2 read (VNNI's
    # three-row kernel once took M = 0 and read a null buffer)
    cases["linear"].append((torch.zeros(0, 576), torch.randint(-128, 128, (9, 576), generator=gen, dtype=torch.int8),
                            torch.ones(9)))
    bitmask = torch.randint(0, 1 << 8, (3, 10), generator=gen, dtype=torch.int32)
    bitmask[0, 1:] = 0                             # 8 ids at most: the sparse path; the others: dense
    cases["head"] = (torch.randn(3, 96, generator=gen), torch.randint(-128, 128, (320, 96), generator=gen, dtype=torch.int8),
                     torch.rand(320, generator=gen), bitmask, torch.tensor([0, 1, 2]))
    return cases


@needs_native
def test_int8_kernels_are_bit_identical(tmp_path, gen: torch.Generator) -> None:
    # Every kernel computes csrc/int8_linear.h's arithmetic: exact integer block dots, one fma per
    # block into lane b % 4, one final tree. So AMX, VNNI, AVX2 and the portable C++ give the same
    # bits (NaN payloads and the sign of zero included) on every shape the engine runs, and the same
    # head argmax: the same model gives the same tokens on every CPU.
    cases = _int8_cases(gen)
    torch.save(cases, tmp_path / "cases.pt")
    runs = {}
    for name, env in _KERNEL_ENVS.items():
        subprocess.run([sys.executable, "-c", _KERNEL_RUN, str(tmp_path / "cases.pt"), str(tmp_path / f"{name}.pt")],
                       env={**os.environ, **env}, check=True)
        runs[name] = torch.load(tmp_path / f"{name}.pt")
    assert runs["portable"]["kernel"] == "portable"
    ran = {name for name, run in runs.items() if run["kernel"] == name}     # this CPU lacks the others
    if ran == {"portable"}:
        pytest.skip("this CPU has neither AVX2 nor AVX512-VNNI: the portable kernel is the only one")
    for name in sorted(ran - {"portable"}):
        for i, (a, b) in enumerate(zip(runs[name]["out"], runs["portable"]["out"], strict=True)):
            assert a.dtype == b.dtype and a.shape == b.shape, (name, i)
            assert torch.equal(a.view(torch.int32) if a.dtype == torch.float32 else a,
                               b.view(torch.int32) if b.dtype == torch.float32 else b), (name, i)   # the bits
    out = runs["portable"]["out"]
    assert all(out[i].isnan()[-1].all() for i in range(13, 19, 2))     # the NaN rows stay NaN
    for (x, q, s), y in zip(cases["linear"][:13], out, strict=False):    # the finite cases, as emulated
        if x.shape[0] <= 5:
            assert torch.equal(y.view(torch.int32), int8_linear_exact(x, q, s).view(torch.int32))


def test_quantize_activations_round_trips_within_half_a_step(gen: torch.Generator) -> None:
    x = torch.randn(3, 96, generator=gen) * torch.tensor([0.01, 1.0, 300.0])[:, None]
    values, scales = native.quantize_activations(x)
    assert values.dtype == torch.int8 and scales.shape == (3, 3)
    assert int(values.abs().max()) == 127                 # each block's largest value maps to ±127
    step = scales.repeat_interleave(32, dim=1)
    assert bool(((values.float() * step - x).abs() <= step / 2 + 1e-6 * x.abs()).all())
    with pytest.raises(ValueError, match="multiple of 32"):
        native.quantize_activations(torch.zeros(1, 48))


def test_int8_linear_rejects_bad_arguments() -> None:
    q = torch.zeros(4, 32, dtype=torch.int8)
    with pytest.raises(ValueError, match="shapes"):
        native.int8_linear(torch.zeros(1, 8), q, torch.ones(4))
    with pytest.raises(ValueError, match="int8"):
        native.int8_linear(torch.zeros(1, 32), q.float(), torch.ones(4))
    with pytest.raises(ValueError, match="backend"):
        native.int8_linear(torch.zeros(1, 32), q, torch.ones(4), backend="nope")
    with pytest.raises(ValueError, match="K % 32"):
        native.int8_linear(torch.zeros(1, 48), torch.zeros(4, 48, dtype=torch.int8), torch.ones(4), backend="native")


@needs_native
@pytest.mark.parametrize("rows", [1, 4])
def test_int8_linear_native_and_torch_agree_closely(rows: int, gen: torch.Generator) -> None:
    x = torch.randn(rows, 64, generator=gen)
    q = torch.randint(-127, 128, (32, 64), generator=gen, dtype=torch.int8)
    scale = (torch.rand(32, generator=gen) * 0.1).bfloat16().float()
    exact = (x.double() @ q.double().T) * scale.double()          # unrounded activations
    for backend in ("native", "torch"):        # int8 blocks of 32 vs bf16 activations: both ~1% off
        y = native.int8_linear(x, q, scale, backend=backend).double()
        assert float((y - exact).norm() / exact.norm()) < 0.02, backend


def _paged_cache(gen: torch.Generator, blocks: list[int], block_size: int, hkv: int, d: int):
    slots = (max(blocks) + 2) * block_size
    k = torch.randn(slots, hkv, d, generator=gen)
    v = torch.randn(slots, hkv, d, generator=gen)
    return k, v, torch.tensor(blocks, dtype=torch.long)


@needs_native
@pytest.mark.parametrize(("start", "n", "block_size"), [(0, 1, 16), (5, 4, 16), (40, 3, 4), (17, 16, 8), (0, 9, 1),
                                                      (120, 16, 16), (250, 5, 8), (383, 2, 16)])  # across 128-key tiles
def test_row_attention_matches_reference(start: int, n: int, block_size: int, gen: torch.Generator) -> None:
    _row_attention_case(6, 2, 32, start, n, block_size, gen)


@needs_native
@pytest.mark.parametrize(("h", "hkv", "d"), [(9, 3, 64), (4, 1, 64), (2, 1, 128), (4, 2, 16)])   # the unrolled shapes
def test_row_attention_matches_reference_per_head_shape(h: int, hkv: int, d: int, gen: torch.Generator) -> None:
    _row_attention_case(h, hkv, d, 140, 4, 16, gen)


@needs_native
@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("start", [0, 140, 383])
def test_row_attention_reads_a_half_cache(start: int, cache_dtype: torch.dtype, gen: torch.Generator) -> None:
    _row_attention_case(9, 3, 64, start, 4, 16, gen, cache_dtype=cache_dtype)


@needs_native
@pytest.mark.parametrize(("start", "n"), [(0, 7), (121, 7), (0, 40), (100, 40), (300, 130)])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
def test_row_attention_of_many_rows_is_each_row_alone(start: int, n: int, cache_dtype: torch.dtype,
                                                      gen: torch.Generator) -> None:
    # Many rows (a verify step, a prompt chunk) take the transposed-keys scores and the paired value
    # sums; a row alone takes neither: the bits must not tell them apart. 7 rows x 3 heads is not a
    # multiple of the 4 queries scored at once.
    _row_attention_case(9, 3, 64, start, n, 16, gen, cache_dtype=cache_dtype)


@needs_native
@pytest.mark.parametrize(("start", "n", "window"), [(0, 5, 3), (200, 5, 1), (200, 5, 7), (120, 40, 16),
                                                    (250, 9, 130), (300, 130, 128), (10, 4, 500)])
def test_row_attention_with_a_sliding_window(start: int, n: int, window: int, gen: torch.Generator) -> None:
    """Row p sees keys p - W + 1 .. p: windows inside a tile, across tile edges, of one key, and wider
    than the context; each row alone gives the same bits (the many-row and one-row paths agree)."""
    _row_attention_case(9, 3, 64, start, n, 16, gen, window=window)
    _row_attention_case(4, 2, 32, start, n, 16, gen, window=window)


def _row_attention_case(h: int, hkv: int, d: int, start: int, n: int, block_size: int, gen: torch.Generator,
                        cache_dtype: torch.dtype = torch.float32, window: int = 0) -> None:
    need = -(-(start + n) // block_size)
    table = list(torch.randperm(need + 3, generator=gen)[:need].tolist())     # scattered blocks
    k, v, blocks = _paged_cache(gen, table, block_size, hkv, d)
    k, v = k.to(cache_dtype), v.to(cache_dtype)               # the reference reads the same rounded values
    q = torch.randn(n, h, d, generator=gen)
    out = native.row_attention(q, k, v, blocks, block_size, start, d ** -0.5, window)
    ref = native.row_attention(q, k, v, blocks, block_size, start, d ** -0.5, window, backend="reference")
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for r in range(n):     # row r alone (one token at position start + r) gives the same bits
        alone = native.row_attention(q[r: r + 1], k, v, blocks, block_size, start + r, d ** -0.5, window)
        assert torch.equal(alone[0], out[r])


@needs_native
def test_row_attention_rejects_a_short_block_table(gen: torch.Generator) -> None:
    k, v, blocks = _paged_cache(gen, [0, 1], 4, 1, 16)
    with pytest.raises(RuntimeError, match="block table"):
        native.row_attention(torch.randn(2, 1, 16), k, v, blocks, 4, 7, 0.25)


@needs_native
@pytest.mark.parametrize(("t", "e"), [(1, 16), (3, 576), (70, 40), (2, 7)])
def test_rms_norm_matches_reference_row_by_row(t: int, e: int, gen: torch.Generator) -> None:
    x = torch.randn(t, e, generator=gen) * 3
    w = torch.randn(e, generator=gen)
    y = native.rms_norm(x, w, 1e-5)
    torch.testing.assert_close(y, native.rms_norm(x, w, 1e-5, backend="reference"), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (e,), w, 1e-5), rtol=1e-5, atol=1e-5)
    assert torch.equal(native.rms_norm(x[-1:], w, 1e-5)[0], y[-1])


@needs_native
@pytest.mark.parametrize("vocab, width", [(1000, 1000), (990, 1024), (49152, 49152), (17, 32)])
def test_masked_argmax_matches_reference(vocab: int, width: int, gen: torch.Generator) -> None:
    rows = 9
    logits = torch.randn(rows, width, generator=gen)
    logits[1, 7] = float("nan")                               # allowed on an unmasked row: the peak is NaN
    logits[2] = float("-inf")                                 # nothing above -inf
    logits[3, 10] = logits[3, vocab - 1] = 50.0               # a tie: the lower id
    logits[4, :vocab] = 1.0                                   # all tied
    logits[5, vocab:] = 1e9                                   # padded ids never count
    bitmask = torch.randint(-2**31, 2**31 - 1, (4, (width + 31) // 32), dtype=torch.int32, generator=gen)
    bitmask[2] = 0                                            # allows nothing
    logits[6, 3] = float("nan")
    bitmask[1, 0] &= ~(1 << 3)                                # a NaN the mask hides does not count
    mask_rows = torch.tensor([0, -1, 1, -1, -1, 3, 1, 2, 0])
    ids, peaks = native.masked_argmax(logits, bitmask, mask_rows, vocab)
    want_ids, want_peaks = native.masked_argmax(logits, bitmask, mask_rows, vocab, backend="reference")
    assert ids.tolist() == want_ids.tolist()
    assert torch.equal(peaks.isnan(), want_peaks.isnan())
    assert peaks[~peaks.isnan()].tolist() == want_peaks[~want_peaks.isnan()].tolist()
    assert ids[3] == 10 and ids[4] == 0 and peaks[1].isnan() and not peaks[6].isnan() and peaks[7] == -math.inf
    for r in (0, 5, 6, 8):                                    # against a plain masked argmax
        words = bitmask[int(mask_rows[r])].to(torch.int64) & 0xFFFFFFFF
        allowed = (((words[:, None] >> torch.arange(32)) & 1).reshape(-1)[:vocab]).bool()
        masked = torch.where(allowed, logits[r, :vocab], torch.tensor(-math.inf))
        assert int(ids[r]) == int(masked.argmax()) and float(peaks[r]) == float(masked.max())


@needs_native
def test_masked_argmax_rejects_bad_arguments() -> None:
    logits, bitmask = torch.zeros(2, 64), torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="outside the bitmask"):
        native.masked_argmax(logits, bitmask, torch.tensor([0, 1]), 64)
    with pytest.raises(RuntimeError, match="vocab"):
        native.masked_argmax(logits, bitmask, torch.tensor([0, -1]), 65)
    with pytest.raises(RuntimeError, match="mask_rows"):
        native.masked_argmax(logits, bitmask, torch.tensor([0]), 64)


@needs_native
@pytest.mark.parametrize("max_sparse", [0, 3, 40, 10**6])
def test_head_argmax_is_masked_argmax_of_the_dense_head(max_sparse: int, gen: torch.Generator) -> None:
    vocab, e = 300, 96                       # a padded head (V > vocab) and a half chunk at the end of E
    q = torch.randint(-127, 128, (320, e), generator=gen, dtype=torch.int8)
    scale = torch.rand(320, generator=gen) * 0.05
    x = torch.randn(9, e, generator=gen)
    x[5] = float("nan")                      # its allowed logits are NaN: peak NaN, id 0
    q[41], scale[41] = q[40], scale[40]      # ids 40 and 41 tie: the lower one wins
    bitmask = torch.zeros(7, 10, dtype=torch.int32)
    bitmask[0, 3] = 0b1011                   # three ids
    bitmask[1] = -1                          # everything (beyond vocab too)
    bitmask[2, :5] = torch.randint(-2**31, 2**31 - 1, (5,), generator=gen, dtype=torch.int32)   # ~80 ids
    bitmask[3, 9] = 1 << 13                  # one id, 301: outside the vocabulary, so none
    bitmask[4, 0] = 1 << 7                   # one id
    bitmask[5, 1] = 0b110                    # two ids, on the NaN row
    bitmask[6, 1] = 0b11 << 8                # ids 40 and 41
    mask_rows = torch.tensor([0, 1, 2, 3, 4, 5, -1, -2, 6])  # -1: no mask (dense); -2: nobody reads it
    ids, peaks = native.head_argmax(x, q, scale, bitmask, mask_rows, vocab, max_sparse)
    want_ids, want_peaks = native.head_argmax(x, q, scale, bitmask, mask_rows, vocab, max_sparse, backend="dense")
    assert torch.equal(ids, want_ids)
    assert torch.equal(peaks.isnan(), want_peaks.isnan())
    assert torch.equal(peaks.nan_to_num(), want_peaks.nan_to_num())            # bit for bit elsewhere
    assert peaks[3] == float("-inf") and peaks[7] == float("-inf") and peaks[5].isnan() and ids[8] == 40
    allowed = torch.tensor([96, 97, 99])     # row 0's ids: bits 0, 1 and 3 of word 3
    assert int(ids[0]) == int(allowed[native.int8_linear(x[:1], q, scale)[0, allowed].argmax()])


@needs_native
def test_head_argmax_rejects_a_mask_row_out_of_range(gen: torch.Generator) -> None:
    q = torch.randint(-127, 128, (64, 32), generator=gen, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="mask_rows"):
        native.head_argmax(torch.randn(1, 32), q, torch.ones(64), torch.zeros(2, 2, dtype=torch.int32),
                           torch.tensor([-3]), 64, 8)
