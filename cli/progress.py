"""Progress where a person waits, on stderr (stdout keeps the results): a spinner while a long step
runs on a terminal, then one line saying what it took, which a log or a pipe gets too."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console


def stderr_console() -> Console:
    """rich on stderr: live displays on a terminal, plain lines elsewhere."""
    return Console(stderr=True, highlight=False, soft_wrap=True)     # lines whole in a log, not cut at 80


@contextmanager
def step(console: Console, what: str) -> Iterator[None]:
    """`with step(console, "loading tiny"):` a spinner on a terminal, a "loading tiny ..." line
    elsewhere (a pipe or a log sees the wait start too), then "loading tiny: 1.2 s"."""
    start = time.perf_counter()
    if not console.is_terminal:
        console.print(f"{what} ...", style="dim")
    with console.status(f"{what} ..."):
        yield
    console.print(f"{what}: {time.perf_counter() - start:.1f} s", style="dim")


@contextmanager
def counted(console: Console, what: str) -> Iterator[Callable[[int, int], None]]:
    """`with counted(console, "converting") as report:` a step that may not happen: nothing shows
    until report(done, total) is first called; then "what: done/total" (a spinner on a terminal, a
    line every tenth elsewhere) and, at the end, the time it took."""
    start, shown, status = time.perf_counter(), [-1], None

    def report(done: int, total: int) -> None:
        nonlocal status
        if status is None:
            status = console.status(f"{what} ...")
            status.start()
        status.update(f"{what}: {done}/{total}")
        tenth = 10 * done // max(total, 1)
        if not console.is_terminal and tenth > shown[0]:
            shown[0] = tenth
            console.print(f"{what}: {done}/{total}", style="dim")

    try:
        yield report
    finally:
        if status is not None:
            status.stop()
            console.print(f"{what}: {time.perf_counter() - start:.1f} s", style="dim")
