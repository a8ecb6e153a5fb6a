"""Classifier-free guidance: combine conditional and unconditional logits per row.

Terms:
  R      rows;  V  vocabulary size
  c, u   conditional and unconditional logits [R, V]
  s      guidance scale [R]: guided = u + s * (c - u); s = 1 gives c, s = 0 gives u
A token that is -inf in either input (masked, or impossible for one sequence) is -inf in
the result: u + s * (c - u) would be NaN or +inf there, and a grammar mask applied to
either side must survive the combine.
"""
from __future__ import annotations

import torch

from interlock.kernels._checks import (
    FLOAT_DTYPES,
    Backend,
    check_device,
    check_dtype,
    check_shape,
    resolve_backend,
)


def cfg_combine(
    cond: torch.Tensor, uncond: torch.Tensor, scale: torch.Tensor, *, backend: Backend = "auto"
) -> torch.Tensor:
    """Return guided logits [R, V] = uncond + scale * (cond - uncond), in cond's dtype.

    The arithmetic runs in float32 whatever the input dtype. Tokens that are -inf in cond
    or uncond are -inf in the result. scale is a float tensor [R] (one scale per row).

    Raises:
        ValueError: unknown backend, wrong dtype or shape, or tensors on different devices.
    """
    check_dtype("cond", cond, FLOAT_DTYPES)
    check_shape("cond", cond, (None, None))
    check_dtype("uncond", uncond, (cond.dtype,))
    check_shape("uncond", uncond, tuple(cond.shape))
    check_dtype("scale", scale, FLOAT_DTYPES)
    check_shape("scale", scale, (cond.shape[0],))
    check_device(cond.device, uncond=uncond, scale=scale)
    if resolve_backend(backend, cond.device) == "reference":
        return cfg_combine_reference(cond, uncond, scale)
    c, u = cond.float(), uncond.float()  # [R, V]
    guided = u + scale.float().unsqueeze(1) * (c - u)  # [R, V]
    banned = (c == float("-inf")) | (u == float("-inf"))
    return guided.masked_fill(banned, float("-inf")).to(cond.dtype)


def cfg_combine_reference(cond: torch.Tensor, uncond: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Slow obvious version: one Python float expression per (row, token)."""
    out = []
    for c_row, u_row, s in zip(cond.float().tolist(), uncond.float().tolist(), scale.float().tolist()):
        out.append([
            float("-inf") if c == float("-inf") or u == float("-inf") else u + s * (c - u)
            for c, u in zip(c_row, u_row)
        ])
    return torch.tensor(out, dtype=torch.float32, device=cond.device).reshape(cond.shape).to(cond.dtype)
