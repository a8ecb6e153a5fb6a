"""The int4 kernel (kernels/csrc/int4_linear.h) against the slow obvious product of what it stands for,
row by row against itself, and each SIMD build against the portable one, bit for bit."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from interlock.kernels import native
from interlock.kernels.int4_pack import dequantize_int4, quantize_int4

needs_native = pytest.mark.skipif(not native.available(), reason="native kernels did not build")

# Every tail a row can end on (K % 256 = 0, 64, 128, 192) and row counts on each blocking path: one
# row; 2-4 rows (widened super-block by super-block, csrc/int4_rows.h); more (panels, tiles of 4
# rows and their 1-3-row tails, blocks of 64 rows, K in slices of 8 super-blocks); output counts that
# leave a block of 3 short.
SHAPES = ((1, 64, 576), (1, 13, 640), (2, 9, 1536), (4, 40, 192), (3, 7, 64), (17, 33, 576), (5, 24, 256),
          (40, 8, 128), (4, 5, 2048), (8, 10, 320), (64, 7, 448), (70, 11, 704), (2, 1, 64), (6, 5, 4416))


def int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    records, offsets = quantize_int4(w)
    return torch.from_numpy(records), torch.from_numpy(offsets)


def cases(gen: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    out = []
    for m, n, k in SHAPES:
        x = torch.randn(m, k, generator=gen) * torch.logspace(-3, 3, m)[:, None]
        x[0, :32] = 0.0                                   # an all-zero activation block: scale 0
        w = torch.randn(n, k, generator=gen) * 0.05 + 0.01
        w[0, :64] = 0.0                                   # all-zero weight blocks: sub-scale 0
        out.append((x, *int4(w)))
    x = torch.randn(2, 128, generator=gen)
    x[1, 3] = float("nan")                                # a NaN: its row's outputs are NaN, the other row's not
    out.append((x, *int4(torch.randn(5, 128, generator=gen))))
    x = torch.randn(5, 320, generator=gen)
    x[1, 7] = float("inf")                                # an infinity: its row is NaN too
    x[2] *= 1e-39                                         # subnormal activations
    x[3, 256:] = 0.0                                      # a zero last super-block
    out.append((x, *int4(torch.randn(4, 320, generator=gen))))
    return out


@needs_native
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_int4_linear_matches_the_float64_product_of_what_it_stands_for(m, n, k, gen) -> None:
    x = torch.randn(m, k, generator=gen)
    records, offsets = int4(torch.randn(n, k, generator=gen) * 0.05)
    got = native.int4_linear(x, records, offsets)
    ref = native.int4_linear(x, records, offsets, backend="reference")
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


@needs_native
def test_each_row_is_computed_from_itself_alone(gen) -> None:
    for x, records, offsets in cases(gen):
        together = native.int4_linear(x, records, offsets)
        alone = torch.cat([native.int4_linear(x[i:i + 1], records, offsets) for i in range(x.shape[0])])
        assert torch.equal(together.isnan(), alone.isnan())
        assert torch.equal(together.nan_to_num().view(torch.int32), alone.nan_to_num().view(torch.int32))


@needs_native
def test_a_nan_activation_poisons_its_own_row_only(gen) -> None:
    x, records, offsets = cases(gen)[-2]
    y = native.int4_linear(x, records, offsets)
    assert y[1].isnan().all() and not y[0].isnan().any()
    x, records, offsets = cases(gen)[-1]                  # the same on the several-row kernel, for an infinity
    y = native.int4_linear(x, records, offsets)
    assert y[1].isnan().all() and not y[[0, 2, 3, 4]].isnan().any()


def test_quantized_weights_stay_within_half_a_step_of_the_floats(gen) -> None:
    w = torch.randn(16, 640, generator=gen) * torch.logspace(-2, 1, 16)[:, None]
    back = dequantize_int4(*int4(w))
    blocks = w.reshape(16, -1, 32)
    step = (blocks.amax(-1) - blocks.amin(-1)) / 15                     # the ideal per-block step
    # the sub-scale is rounded up to D * sc (8 bits under the super-block's largest): the step grows
    # by at most D, the super-block's largest step / 127
    largest = step.reshape(16, -1).split([8, 8, 4], dim=1)
    bound = torch.cat([s.amax(1, keepdim=True).expand_as(s) for s in largest], dim=1) / 127 + step
    err = (back - w).abs().reshape(16, -1, 32).amax(-1)
    assert (err <= 0.5 * bound * 1.001 + 1e-6).all()


_RUN = """
import sys, torch
from interlock.kernels import native
cases = torch.load(sys.argv[1])
torch.save({"kernel": native.int4_kernel(), "out": [native.int4_linear(*c) for c in cases]}, sys.argv[2])
"""


@needs_native
def test_every_simd_build_gives_the_portable_bits(tmp_path, gen) -> None:
    # VNNI and AVX2 compute the portable kernel's operations in its order (exact integer lane sums,
    # the same fp32 fma per super-block, the same trees): each must give its bits. INTERLOCK_SIMD=avx2
    # builds the AVX2 path on an AVX-512 machine too, so both are checked wherever AVX-512 runs.
    torch.save(cases(gen), tmp_path / "cases.pt")
    runs = {}
    for name in ("1", "avx2", "0"):
        out = tmp_path / f"{name}.pt"
        subprocess.run([sys.executable, "-c", _RUN, str(tmp_path / "cases.pt"), str(out)],
                       env={**os.environ, "INTERLOCK_SIMD": name}, check=True)
        runs[name] = torch.load(out)
    assert runs["0"]["kernel"] == "portable"
    simd = [name for name in ("1", "avx2") if runs[name]["kernel"] != "portable"]
    if not simd:
        pytest.skip("this CPU has neither AVX2 nor AVX512-VNNI: the portable kernel is the only one")
    for name in simd:
        for i, (a, b) in enumerate(zip(runs[name]["out"], runs["0"]["out"], strict=True)):
            assert torch.equal(a.isnan(), b.isnan()), (runs[name]["kernel"], i)
            assert np.array_equal(a.nan_to_num().view(torch.int32).numpy(), b.nan_to_num().view(torch.int32).numpy()), \
                (runs[name]["kernel"], i)
