"""overlap_bench's arithmetic: the exposed part of a span against a slow obvious reference (a fine
grid), each fill timed from its own step's launch, and each launch's wait for the next mark."""
from __future__ import annotations

import random

from interlock.benchmarks.overlap_bench import exposed_s, next_after, since_launch, union


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


def test_each_fill_is_timed_from_the_last_launch_before_it() -> None:
    rng = random.Random(3)
    for _ in range(50):
        launches = sorted(rng.uniform(0, 10) for _ in range(rng.randint(1, 6)))
        fills = [(a, a + rng.uniform(0, 1)) for a in (rng.uniform(-1, 11) for _ in range(rng.randint(0, 6)))]
        want = []
        for start, end in sorted(fills):
            before = [t for t in launches if t <= start]
            if before:
                want.append((start - before[-1], end - before[-1]))
        assert since_launch(launches, fills) == want


def test_each_launch_is_timed_to_the_first_mark_at_or_after_it() -> None:
    rng = random.Random(5)
    for _ in range(50):
        launches = [rng.uniform(0, 10) for _ in range(rng.randint(0, 6))]
        marks = sorted(rng.uniform(0, 10) for _ in range(rng.randint(0, 8)))
        want = [min(m for m in marks if m >= t) - t for t in sorted(launches) if any(m >= t for m in marks)]
        assert next_after(launches, marks) == want
