"""Argument checks shared by the kernel dispatchers: backend names, dtypes, devices, shapes.

Every check here reads only tensor metadata (dtype, device, shape), never values, so a
dispatcher can run them on a hot path without a host sync.
"""
from __future__ import annotations

from typing import Literal, TypeAlias

import torch

Backend: TypeAlias = Literal["auto", "torch", "reference", "cuda"]
Resolved: TypeAlias = Literal["torch", "reference"]

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES: tuple[torch.dtype, ...] = (torch.int32, torch.int64)


def resolve_backend(backend: str, device: torch.device) -> Resolved:
    """Map a requested backend to an implementation, or raise ValueError."""
    if backend == "auto":
        # The CUDA variants will be chosen here for CUDA tensors once they exist.
        return "torch"
    if backend in ("torch", "reference"):
        return backend  # type: ignore[return-value]
    if backend == "cuda":
        if device.type != "cuda":
            raise ValueError(f"backend 'cuda' needs CUDA tensors, got device {device}")
        raise ValueError("backend 'cuda' is not built in this version; use 'torch' or 'auto'")
    raise ValueError(f"unknown backend {backend!r}; expected 'auto', 'torch', 'reference' or 'cuda'")


def check_dtype(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    """Raise ValueError unless `t.dtype` is one of `allowed`."""
    if t.dtype not in allowed:
        names = ", ".join(str(d) for d in allowed)
        raise ValueError(f"{name} must have dtype in ({names}), got {t.dtype}")


def check_device(device: torch.device, **tensors: torch.Tensor | None) -> None:
    """Raise ValueError if any given tensor lives on another device than `device`."""
    for name, t in tensors.items():
        if t is not None and t.device != device:
            raise ValueError(f"{name} is on {t.device} but the logits are on {device}")


def check_shape(name: str, t: torch.Tensor, shape: tuple[int | None, ...]) -> None:
    """Raise ValueError unless `t` has len(shape) dims and matches every non-None size."""
    ok = t.dim() == len(shape) and all(s is None or s == n for s, n in zip(shape, t.shape))
    if not ok:
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(t.shape)}")
