"""One tensor-parallel rank as its own `python -m` process (parallel/worker.py for the host runner,
parallel/device_worker.py for the device runner).

Not multiprocessing's spawn: spawn re-runs the parent's main module in every child, which fails
when the main program is `python -` (no file to re-run), and which starts the engine again from a
script without a `__main__` guard or from inside a Ray worker. A `-m` child imports interlock and
nothing of the parent's program.

The parent and the rank talk over a socket pair, a multiprocessing Connection at each end (what
`multiprocessing.Pipe()` is on POSIX). A second pipe is the rank's sentinel: the child inherits its
write end and never writes, so the read end turns readable, at end-of-file, once the child has
exited however it exited: `multiprocessing.connection.wait` watches it like `Process.sentinel`.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

WORKER_MODULE = "interlock.parallel.worker"


class RankProcess:
    """A started rank: `pid`, `name`, `sentinel` (an fd), and the few Process calls the group uses."""

    def __init__(self, popen: subprocess.Popen, name: str, sentinel: int) -> None:
        self._popen, self.name, self.sentinel = popen, name, sentinel

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def exitcode(self) -> int | None:
        """The exit code (-N: killed by signal N), None while it runs."""
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        if self.is_alive():
            self._popen.kill()

    def close(self) -> None:
        """Release the sentinel (after the process is reaped)."""
        if self.sentinel >= 0:
            os.close(self.sentinel)
            self.sentinel = -1


def start_rank(rank: int, hello: object, module: str = WORKER_MODULE) -> tuple[RankProcess, Connection]:
    """Start rank `rank` as `python -m module FD RANK` and send it `hello` (its first message)."""
    ours, theirs = socket.socketpair()
    sentinel, child_end = os.pipe()
    try:
        popen = subprocess.Popen([sys.executable, "-m", module, str(theirs.fileno()), str(rank)],
                                 pass_fds=(theirs.fileno(), child_end), stdin=subprocess.DEVNULL, env=child_env())
    except BaseException:
        ours.close()
        os.close(sentinel)
        raise
    finally:
        theirs.close()
        os.close(child_end)
    conn = Connection(ours.detach())
    conn.send(hello)
    return RankProcess(popen, f"interlock-tp{rank}", sentinel), conn


def reap(procs: list[RankProcess], conns: list[Connection], grace_s: float, stop: bytes | None = None) -> None:
    """Send each rank `stop` (when given: its stop message), give them `grace_s` seconds in all to
    exit, kill those left, join every one, and close their sentinels and pipes."""
    for conn in conns if stop is not None else ():
        try:
            conn.send_bytes(stop or b"")        # stop is set: the loop runs only with one
        except OSError:
            pass                        # it is gone already
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        proc.kill()                     # a no-op for one that exited
        proc.join(5.0)
        proc.close()
    for conn in conns:
        conn.close()


def child_env() -> dict[str, str]:
    """This environment, with the folder this process imported interlock from first on PYTHONPATH,
    so that the rank imports the same interlock (a checkout on sys.path, not only an installed one)."""
    env = dict(os.environ)
    package = Path(__file__).resolve().parents[1]       # the package's folder: parallel/ sits in it
    if package.name == "interlock":         # else an editable install's finder maps the name
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package.parent), env.get("PYTHONPATH")) if p)
    return env
