"""overlap_bench's arithmetic: the exposed part of a span against a slow obvious reference (a fine grid)."""
from __future__ import annotations

import random

from interlock.benchmarks.overlap_bench import exposed_s, union


def grid_exposed(span: tuple[float, float], busy: list[tuple[float, float]], step: float = 1e-3) -> float:
    lo, hi = span
    n = round((hi - lo) / step)
    points = (lo + (i + 0.5) * step for i in range(n))
    return step * sum(not any(a <= t < b for a, b in busy) for t in points)


def test_exposed_time_matches_a_grid_count_over_overlapping_busy_intervals() -> None:
    rng = random.Random(7)
    for _ in range(50):
        raw = [(a, a + rng.randint(1, 300) / 1000) for a in (rng.randint(0, 1000) / 1000 for _ in range(6))]
        busy = union(raw)
        assert all(b0 < a1 for (_, b0), (a1, _) in zip(busy, busy[1:]))         # disjoint and sorted
        start = rng.randint(0, 1000) / 1000
        span = (start, start + rng.randint(1, 500) / 1000)
        assert abs(exposed_s(span, busy) - grid_exposed(span, raw)) < 1e-6
