"""Python callables on a CUDA stream (cuLaunchHostFunc) that captured graphs may replay.

Why not an off-the-shelf wrapper: cupy's and cuda-python's `launchHostFunc` free the Python
callable after its first run (cupy issue 9274, cuda-python issue 790), so a host node inside a
captured CUDA graph calls freed memory on its second replay. Here a `HostFunctions` registry owns
every callable a stream or graph may still call, keyed by an integer that travels as the
callback's `userData`:

- an *eager* launch (`once=True`) is dropped from the registry right after it runs;
- a *captured* launch (`once=False`) stays until its owner (a captured program) calls
  `release(keys)`, which it does only once the graph can no longer run.

The trampoline is a ctypes callback, so it takes the GIL itself (PyGILState_Ensure) on the
driver's callback thread. Callbacks must make no CUDA call (the driver forbids it, and it could
deadlock); they must be quick, because the driver may run the host functions of every stream on
one thread, one after another. The binding is the driver's `cuLaunchHostFunc` from libcuda.so.1,
the one driver every CUDA runtime in the process (torch's included) talks to; a torch stream's
`cuda_stream` handle is a valid CUstream.
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from interlock.logs import get_logger

log = get_logger(__name__)

_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class HostFuncError(RuntimeError):
    """The driver refused a host-function launch (the message carries its error name)."""


@dataclass(frozen=True)
class _Entry:
    fn: Callable[..., object]
    args: tuple[object, ...]
    once: bool


def _load_driver() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, _HOST_FN, ctypes.c_void_p]
    lib.cuLaunchHostFunc.restype = ctypes.c_int
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuGetErrorName.restype = ctypes.c_int
    return lib


class HostFunctions:
    """The registry of callables that streams and captured graphs may call (see the module docstring).

    One per timeline; not a global. `on_error` is told about an exception a callable raised (the
    trampoline itself never lets one escape into the driver).
    """

    def __init__(self, on_error: Callable[[BaseException], None] | None = None) -> None:
        self._driver = _load_driver()
        self._lock = threading.Lock()
        self._entries: dict[int, _Entry] = {}
        self._next_key = 1
        self._on_error = on_error
        self._trampoline = _HOST_FN(self._call)  # must outlive every launch: kept by self

    @property
    def pending(self) -> int:
        """Callables the registry still keeps alive (eager ones not yet run + captured ones)."""
        with self._lock:
            return len(self._entries)

    def launch(self, stream: int, fn: Callable[..., object], args: tuple[object, ...] = (), *,
               once: bool = True) -> int:
        """Enqueue `fn(*args)` on the CUstream handle `stream`; returns the registry key.

        once=True: freed after it runs (eager launch). once=False: kept until `release` (a launch
        made while the stream is being captured into a graph, which may replay it many times).
        Raises HostFuncError if the driver refuses (nothing is kept then).
        """
        with self._lock:
            key = self._next_key
            self._next_key += 1
            self._entries[key] = _Entry(fn, args, once)
        result = self._driver.cuLaunchHostFunc(ctypes.c_void_p(stream), self._trampoline, ctypes.c_void_p(key))
        if result != 0:
            with self._lock:
                self._entries.pop(key, None)
            raise HostFuncError(f"cuLaunchHostFunc failed: {self._error_name(result)}")
        return key

    def release(self, keys: Iterable[int]) -> None:
        """Forget captured callables; call only once no graph holding them can run again."""
        with self._lock:
            for key in keys:
                self._entries.pop(key, None)

    def _call(self, user_data: int | None) -> None:
        # Runs on the driver's callback thread with the GIL (ctypes took it).
        key = user_data or 0
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.once:
                del self._entries[key]
        if entry is None:
            log.error("host_function_missing", key=key)  # released while a graph could still run
            return
        try:
            entry.fn(*entry.args)
        except BaseException as exc:  # noqa: BLE001 - nobody above the driver's thread to raise to
            if self._on_error is None:
                log.error("host_function_failed", error=repr(exc))
            else:
                self._on_error(exc)

    def _error_name(self, code: int) -> str:
        name = ctypes.c_char_p()
        if self._driver.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
            return f"{name.value.decode()} ({code})"
        return f"CUresult {code}"
