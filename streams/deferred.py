"""Device work as CUDA runs it, on the CPU: a callable's Python runs now, its tensor ops later.

On CUDA, `lane.launch(fn)` runs fn's Python at once, on the calling thread; the kernels it issues
run later, in stream order. `DeferredWork(sink)` gives the CPU the same split. While it is
active on a thread, every aten op that thread issues is intercepted (a `TorchDispatchMode`):

- views and allocations (`view`, `slice`, `empty`, ...) run at once: they touch no data;
- every other op is checked on meta tensors (shapes, dtypes and shape errors arrive at the call,
  as a CUDA launch reports them), gets real output tensors allocated now, and is handed to the
  sink as a deferred op that computes it later, on the lane, into those outputs;
- an op whose output shape depends on data (`nonzero`, boolean indexing) and an op that returns
  a value to Python (`item`, `bool`, `equal`) read device data on the host: a *host sync*.

Python-level reads that never reach the dispatcher (`tolist`, `numpy`, `repr`, `data_ptr`) are
caught one level up (a `TorchFunctionMode`). A host sync calls `sink.sync(what)` first: during
capture that raises (a CUDA graph cannot capture it, or would replay a frozen value); eagerly it
waits for the lane to run everything issued so far, as `cudaStreamSynchronize` does, and counts.

Deferred ops run without these modes, on the lane's thread, in inference mode (outputs allocated
under `torch.inference_mode()` may only be written there).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

aten = torch.ops.aten


# Metadata or allocation only: safe to run when issued.
_NOW = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default, aten.new_empty.default,
        aten.new_empty_strided.default, aten.lift_fresh.default, aten.detach.default, aten.alias.default,
        aten.resize_.default, aten.set_.source_Tensor, aten.is_same_size.default}
# Python-level reads of a tensor's data that bypass the dispatcher.
_READS = {"tolist", "numpy", "item", "__bool__", "__int__", "__float__", "__index__", "__complex__", "__array__",
          "__repr__", "__str__", "__format__", "data_ptr", "__reduce_ex__", "__dlpack__"}


class Sink(Protocol):
    """Where DeferredWork sends what it intercepts (a lane of streams/cuda_rules.py)."""

    def emit(self, op: DeferredOp) -> None:
        """A deferred op, in issue order."""
        ...

    def sync(self, what: str) -> None:
        """The host is about to read device data: raise during capture, else wait for the lane."""
        ...


class DeferredWork:
    """Context manager: on this thread, defer tensor ops to `sink` and report host reads to it."""

    def __init__(self, sink: Sink) -> None:
        self._dispatch = _Defer(sink)
        self._reads = _Reads(sink, self._dispatch)

    def __enter__(self) -> DeferredWork:
        self._dispatch.__enter__()
        self._reads.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._reads.__exit__(*exc)
        self._dispatch.__exit__(*exc)


class _Defer(TorchDispatchMode):
    def __init__(self, sink: Sink) -> None:
        super().__init__()
        self.sink = sink
        self.reading = False      # a read the function mode already reported is running its aten op

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.reading or func in _NOW:
            return func(*args, **kwargs)
        if _composite(func):
            # `to`, `reshape`, `contiguous`...: view or copy depending on the input; their parts decide
            with self:                                  # its parts come back through this mode
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        if func.is_view:
            return func(*args, **kwargs)
        try:
            meta = func(*tree_map(_to_meta, args), **_meta_kwargs(kwargs))
        except (NotImplementedError, RuntimeError) as exc:
            if not _data_dependent(exc):
                raise                                  # a shape or dtype error: reported at the call
            return self._now(func, args, kwargs, f"{func} (its output shape depends on data)")
        if not all(isinstance(x, torch.Tensor) for x in tree_flatten(meta)[0]):
            return self._now(func, args, kwargs, f"{func} (returns a value to Python)")
        outs = _outputs(func, args, kwargs, meta)
        self.sink.emit(DeferredOp(func, args, kwargs, outs))
        return outs

    def _now(self, func: Any, args: tuple, kwargs: dict, what: str) -> Any:
        self.sink.sync(what)
        return func(*args, **kwargs)


class _Reads(TorchFunctionMode):
    def __init__(self, sink: Sink, dispatch: _Defer) -> None:
        super().__init__()
        self.sink = sink
        self.dispatch = dispatch

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name not in _READS:
            return func(*args, **kwargs)
        self.sink.sync(f"Tensor.{name}()")
        self.dispatch.reading = True
        try:
            return func(*args, **kwargs)
        finally:
            self.dispatch.reading = False


def _composite(func: Any) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")


def _to_meta(x: object) -> object:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, torch.device):
        return torch.device("meta")
    return x


def _meta_kwargs(kwargs: dict) -> dict:
    out = {k: tree_map(_to_meta, v) for k, v in kwargs.items()}
    if "pin_memory" in out:
        out["pin_memory"] = False
    return out


def _data_dependent(exc: BaseException) -> bool:
    """Meta kernels refuse ops whose output depends on data (and ops they lack: those run now too)."""
    text = str(exc)
    return isinstance(exc, NotImplementedError) or "meta" in text.lower() or "data-dependent" in text


def _written_args(func: Any, args: tuple, kwargs: dict) -> dict[str, torch.Tensor]:
    """Alias set -> the argument tensor an op writes (self of an in-place op, `out=`)."""
    bound: dict[str, torch.Tensor] = {}
    for i, a in enumerate(func._schema.arguments):
        info = a.alias_info
        if info is None or not info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(a.name)
        if isinstance(value, torch.Tensor):
            for name in info.before_set:
                bound[name] = value
    return bound


def _outputs(func: Any, args: tuple, kwargs: dict, meta: Any) -> Any:
    """The op's return value: the arguments it writes where it returns them, else fresh tensors
    shaped as the meta kernel says (allocated now, filled when the op runs)."""
    written = _written_args(func, args, kwargs) if func._schema.is_mutable else {}
    returns = func._schema.returns
    flat, spec = tree_flatten(meta)
    out = []
    for i, m in enumerate(flat):
        info = returns[i].alias_info if i < len(returns) else None
        alias = next(iter(info.before_set), None) if info is not None else None
        if alias is not None and alias in written:
            out.append(written[alias])
        else:
            out.append(torch.empty_strided(m.size(), m.stride(), dtype=m.dtype, device="cpu"))
    return spec.unflatten(out)


@dataclass(frozen=True, eq=False)
class DeferredOp:
    """One intercepted op: run later, it computes `func` into the outputs handed out at the call."""

    func: Any
    args: tuple
    kwargs: dict
    outs: Any

    def __call__(self) -> None:
        result = self.func(*self.args, **self.kwargs)
        for out, value in zip(tree_flatten(self.outs)[0], tree_flatten(result)[0]):
            if out is not value:
                out.copy_(value)

    def __repr__(self) -> str:
        return f"DeferredOp({self.func})"
