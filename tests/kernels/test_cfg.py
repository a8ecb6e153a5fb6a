"""cfg_combine: fast path against the reference, endpoints of the scale, -inf handling."""
from __future__ import annotations

import pytest
import torch

from interlock.kernels.cfg import cfg_combine


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fast_matches_reference(dtype: torch.dtype, gen: torch.Generator) -> None:
    cond = torch.randn(5, 300, generator=gen).to(dtype)
    uncond = torch.randn(5, 300, generator=gen).to(dtype)
    cond[0, :10] = float("-inf")
    uncond[1, 5:20] = float("-inf")
    scale = torch.tensor([0.0, 1.0, 1.5, 3.0, -0.5])
    fast = cfg_combine(cond, uncond, scale, backend="torch")
    ref = cfg_combine(cond, uncond, scale, backend="reference")
    assert fast.dtype == dtype
    torch.testing.assert_close(fast, ref)
    assert bool((fast[0, :10] == float("-inf")).all()) and bool((fast[1, 5:20] == float("-inf")).all())
    assert not bool(fast.isnan().any())


def test_scale_endpoints_and_formula(gen: torch.Generator) -> None:
    cond, uncond = torch.randn(3, 50, generator=gen), torch.randn(3, 50, generator=gen)
    out = cfg_combine(cond, uncond, torch.tensor([0.0, 1.0, 2.0]))
    torch.testing.assert_close(out[0], uncond[0])
    torch.testing.assert_close(out[1], cond[1])
    torch.testing.assert_close(out[2], 2 * cond[2] - uncond[2])


def test_dispatcher_raises_value_error() -> None:
    c, s = torch.zeros(2, 8), torch.ones(2)
    bad_calls = [
        lambda: cfg_combine(c, c, s, backend="fast"),
        lambda: cfg_combine(c, c, s, backend="cuda"),
        lambda: cfg_combine(c.long(), c.long(), s),
        lambda: cfg_combine(c, c.half(), s),
        lambda: cfg_combine(c, c[:1], s),
        lambda: cfg_combine(c, c, torch.ones(3)),
        lambda: cfg_combine(c, c.to("meta"), s),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()
