"""Capture what native code writes to file descriptor 2 during a call (xgrammar's warnings).

xgrammar 0.2.x reports what it drops or approximates ("oneOf ... falling back to anyOf", "allOf
with multiple options") with C++ logging straight to stderr, with no Python hook. Those lines are
the only evidence of a loose grammar, so compile runs with fd 2 pointed at a temporary file.

fd 2 is one per process, so one process-wide lock serializes the redirection (a resource the
process owns once needs a lock the process holds once). A compile stuck past the cache's timeout
keeps holding it, so a waiter gives up after `wait_s` and runs uncaptured (returns None for the
lines: the caller must then assume the worst) rather than be delayed by an unrelated compile. Lines that are not
the native library's own (another thread's Python
traceback, say) are written back to the real stderr afterwards, so nothing is swallowed.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
_FD2 = threading.Lock()          # guards the process-wide fd 2 (see the module docstring)
# xgrammar's log prefix: "[05:03:24] /project/cpp/json_schema_converter.cc:832: Warning: ..."
NATIVE_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] \S+\.(?:cc|h|cpp):\d+: ")


def call_capturing_stderr(fn: Callable[[], T], wait_s: float = 2.0) -> tuple[T, list[str] | None]:
    """fn() and the native log lines it wrote to fd 2 (prefix stripped), or None when another
    capture held fd 2 for wait_s; raises what fn raises."""
    if not _FD2.acquire(timeout=wait_s):
        return fn(), None
    try:
        return _captured(fn)
    finally:
        _FD2.release()


def _captured(fn: Callable[[], T]) -> tuple[T, list[str]]:
    with tempfile.TemporaryFile(mode="w+b") as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        error: BaseException | None = None
        try:
            result = fn()
        except BaseException as exc:         # re-raised below, once stderr is restored
            error = exc
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines = sink.read().decode(errors="replace").splitlines()
    others = [line for line in lines if not NATIVE_LINE.match(line)]
    if others:
        sys.stderr.write("\n".join(others) + "\n")
    if error is not None:
        raise error
    return result, [NATIVE_LINE.sub("", line) for line in lines if NATIVE_LINE.match(line)]
