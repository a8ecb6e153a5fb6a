"""Helpers shared by the benchmark scripts: robust summaries, the machine (load, CPU), a rich table, the
JSON last line.

Every script prints a human table first and, as its very last line, one JSON object, so that a
caller (CI, the `bench` CLI, another script) can parse the result with `json.loads(lines[-1])`.
"""
from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.table import Table

T = TypeVar("T")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks; NaN if empty."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must lie in [0, 100], got {q}")
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """(fn(), seconds it took) with the monotonic high-resolution clock."""
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def repeat_times(fn: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
    """Seconds of each of `repeats` calls of fn, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def load_average() -> tuple[float, float, float] | None:
    """The 1/5/15-minute load average, where the OS reports one (shared machines skew timings)."""
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return None


def cpu_name() -> str:
    """The CPU's model name and the SIMD that matters here (AMX, AVX512-VNNI, AVX2), as the OS reports them."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                 platform.machine())
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    simd = [name for name, flag in (("AMX", "amx_tile"), ("AVX512-VNNI", "avx512_vnni"), ("AVX2", "avx2"))
            if flag in flags]
    return f"{model} ({', '.join(simd) or 'no AVX2'}; {os.cpu_count()} CPUs)"


def oversubscribed(threads: int) -> bool:
    """True when the 1-minute load plus our threads exceed the cores: timings then mostly measure
    waiting (with OpenMP, every small op waits until all its threads get a core)."""
    load, cores = load_average(), os.cpu_count() or 1
    return load is not None and load[0] + threads > cores + 0.5


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
                console: Console | None = None) -> None:
    """A rich table; floats are shown with 2 decimals, the first column left, the rest right."""
    table = Table(title=title)
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=i == 0)
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    # Piped output (CI logs, `| tee`) would otherwise be squeezed into rich's 80-column default.
    (console or Console(file=sys.stdout, width=None if sys.stdout.isatty() else 120)).print(table)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:,.2f}"
    return str(value)


def print_json_last(result: dict[str, Any]) -> None:
    """The machine-readable result, on one line; call it last. NaN becomes null (valid JSON)."""
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in result.items()}
    sys.stdout.flush()
    print(json.dumps(clean, sort_keys=True), flush=True)
