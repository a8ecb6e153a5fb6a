"""Argument checks shared by the kernel dispatchers: backend names, dtypes, devices, shapes.

Every check here reads only tensor metadata (dtype, device, shape), never values, so a
dispatcher can run them on a hot path without a host sync.
"""
from __future__ import annotations

import functools
import importlib.util
from typing import Literal, TypeAlias

import torch

# capturable: no host read (no .item(), no data-dependent shape), so it may run inside a captured
# step: the CUDA variant on CUDA tensors, plain tensor ops elsewhere ("tensor").
Backend: TypeAlias = Literal["auto", "torch", "reference", "cuda", "capturable"]
Resolved: TypeAlias = Literal["torch", "reference", "cuda", "tensor"]

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES: tuple[torch.dtype, ...] = (torch.int32, torch.int64)


def resolve_backend(backend: str, device: torch.device, *, has_cuda: bool = False) -> Resolved:
    """Map a requested backend to an implementation, or raise ValueError.

    has_cuda: the kernel has a CUDA (Triton) variant; "auto" picks it for CUDA tensors.
    "cuda" on tensors of another device, or for a kernel without that variant, is a ValueError.
    """
    if backend == "auto":
        return "cuda" if has_cuda and device.type == "cuda" and _triton_available() else "torch"
    if backend == "capturable":
        return "cuda" if has_cuda and device.type == "cuda" and _triton_available() else "tensor"
    if backend in ("torch", "reference"):
        return backend  # type: ignore[return-value]
    if backend == "cuda":
        if device.type != "cuda":
            raise ValueError(f"backend 'cuda' needs CUDA tensors, got device {device}")
        if not has_cuda:
            raise ValueError("this kernel has no 'cuda' backend; use 'torch' or 'auto'")
        if not _triton_available():
            raise ValueError("backend 'cuda' needs triton, which is not installed")
        return "cuda"
    raise ValueError(f"unknown backend {backend!r}; expected 'auto', 'torch', 'reference', 'cuda' or 'capturable'")


@functools.cache
def _triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


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
