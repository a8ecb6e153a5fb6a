"""`python -m interlock.benchmarks.int4_rows --baseline DIR`: the native int4_linear of this checkout
against another checkout's (DIR holds it as `interlock/`), by row count, at Llama-3.2-1B's shapes.

    mkdir -p /tmp/base/interlock && git archive main | tar -x -C /tmp/base/interlock
    python -m interlock.benchmarks.int4_rows --baseline /tmp/base --rounds 3

Each side runs in a child process of its own (the kernels register one torch.ops namespace per
process), importing `interlock` from its own path (this file, run by its path, is the child in
both); the sides alternate round by round (this checkout first in even rounds), so that load from
other processes on a shared machine hits both alike. A child times int4_linear(x [M, K], W [N, K])
for each shape and M (median of --repeats calls after a warm-up, --threads torch threads; at 1
thread in CPU seconds, which a shared machine's other processes do not stretch, else in wall
seconds) and hashes every output: the two sides' hashes must agree, since both compute the portable
kernel's bits (kernels/csrc/int4_linear.h). The table gives each side's median over rounds in ms,
new / old, and each side's M-row time over its 1-row time (what a verify step's projections cost
against a decode step's).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from interlock.benchmarks.common import load_average, median, print_json_last, print_table

SHAPES = ((2048, 2048), (2048, 512), (2048, 8192), (8192, 2048))     # (K, N): q/o, k/v, gate/up, down
ROWS = (1, 4, 16, 64, 256)


def cpu_times(fn, repeats: int) -> list[float]:
    """CPU seconds of each of `repeats` calls of fn (after one untimed): at one thread, what the
    kernel costs even while other processes take turns on the cores."""
    import time

    fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return times


def child(rows: list[int], repeats: int, threads: int) -> dict:
    import numpy as np
    import torch

    from interlock.benchmarks.common import repeat_times
    from interlock.kernels import native
    from interlock.kernels.int4_pack import quantize_int4

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    out: dict = {"kernel": native.int4_kernel(), "times_ms": {}, "hashes": {}}
    for k, n in SHAPES:
        records, offsets = (torch.from_numpy(a) for a in quantize_int4(torch.randn(n, k, generator=gen) * 0.05))
        x = torch.randn(max(rows), k, generator=gen)
        for m in rows:
            xm = x[:m].contiguous()
            key = f"K{k}_N{n}_M{m}"
            times = cpu_times(lambda: native.int4_linear(xm, records, offsets), repeats) if threads == 1 \
                else repeat_times(lambda: native.int4_linear(xm, records, offsets), repeats)   # noqa: B023
            out["times_ms"][key] = median(times) * 1e3
            y = native.int4_linear(xm, records, offsets).numpy()
            out["hashes"][key] = hashlib.sha256(np.ascontiguousarray(y).tobytes()).hexdigest()[:16]
    return out


def run_side(path: str, args: argparse.Namespace) -> dict:
    # this file by its path, so that a baseline without it runs it too, on its own kernels
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--rows", ",".join(map(str, args.rows)),
           "--repeats", str(args.repeats), "--threads", str(args.threads)]
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", help="a folder holding the other checkout as interlock/ (required)")
    p.add_argument("--rows", type=lambda s: [int(v) for v in s.split(",")], default=list(ROWS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=9, help="timed calls per figure in a child (median)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="save the raw rounds as JSON here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.rows, args.repeats, args.threads)))
        return
    if not args.baseline:
        p.error("--baseline is required")
    import interlock

    here = str(Path(interlock.__file__).parent.parent)    # the folder that holds this checkout as interlock/
    sides = {"new": here, "old": args.baseline}
    load_before = load_average()
    rounds = []
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        rounds.append({side: run_side(sides[side], args) for side in order})
    rows, summary = [], {}
    same = all(rd[s]["hashes"] == rounds[0]["new"]["hashes"] for rd in rounds for s in sides)
    for k, n in SHAPES:
        ms = {s: {m: median([rd[s]["times_ms"][f"K{k}_N{n}_M{m}"] for rd in rounds]) for m in args.rows}
              for s in sides}
        for m in args.rows:
            new, old = ms["new"][m], ms["old"][m]
            rows.append((f"K{k} N{n}", m, round(old, 3), round(new, 3), new / old, old / ms["old"][args.rows[0]],
                         new / ms["new"][args.rows[0]]))
            summary[f"K{k}_N{n}_M{m}"] = {"old_ms": round(old, 4), "new_ms": round(new, 4),
                                          "new_over_old": round(new / old, 3)}
    print_table(f"int4_linear, {args.threads} threads, medians of {args.rounds} alternating rounds "
                f"(kernels: new {rounds[0]['new']['kernel']}, old {rounds[0]['old']['kernel']}; same bits: {same})",
                ["shape", "M", "old ms", "new ms", "new/old", f"old M/M{args.rows[0]}", f"new M/M{args.rows[0]}"],
                rows)
    result = {"same_bits": same, "threads": args.threads, "loadavg_before": load_before,
              "loadavg_after": load_average(), "summary": summary}
    if args.out:
        args.out.write_text(json.dumps({**result, "rounds": rounds}, indent=1))
    print_json_last(result)


if __name__ == "__main__":
    main()
