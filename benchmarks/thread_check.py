"""`python -m interlock.benchmarks.thread_check`: what torch threads cost on a lane thread.

The engine runs the forward on a lane thread (streams/cpu_timeline.py). OpenMP gives every thread
that runs a parallel op a worker pool of its own; this measures, side by side in one process,
the bare decode step of the model (int8, batch 1, --context tokens of context; median of
--steps steps) run on a lane thread in three settings, each in a fresh subprocess:

- lane1:        the lane at 1 thread (the engine's setting before 2026-11-23);
- lane2:        the lane at 2 threads, the main thread at 1 (one OpenMP pool: the engine now);
- lane2+main2:  the lane at 2 threads after the main thread ran a parallel op at 2 (two pools:
                what a process that loads at torch's default threads gets).

Prints a table and one JSON line; saves the JSON under benchmarks/results/.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import date
from pathlib import Path

from interlock.benchmarks.common import load_average, percentile, print_json_last, print_table

RESULTS = Path(__file__).resolve().parent / "results"
SETTINGS = {"lane1": (1, 1), "lane2": (1, 2), "lane2+main2": (2, 2)}     # (main threads, lane threads)


def measure(main_threads: int, lane_threads: int, model: str, context: int, steps: int) -> list[float]:
    """In this process: decode-step times (ms) on a lane thread."""
    import queue
    import threading
    import time

    import torch

    from interlock.models.batch import SeqChunk, build_batch
    from interlock.models.kv_cache import PagedKVCache
    from interlock.models.loader import load_model

    torch.set_num_threads(main_threads)
    lm = load_model(model)
    if main_threads > 1:                       # the main thread's pool exists from here on
        torch.randn(512, 512) @ torch.randn(512, 512)

    def decode() -> list[float]:
        torch.get_num_threads()
        torch.set_num_threads(lane_threads)
        kv = PagedKVCache(lm.config, num_blocks=-(-(context + steps + 8) // 16), block_size=16)
        kv.add_sequence(0)
        kv.reserve(0, context)
        lm.model(build_batch([SeqChunk(0, tuple(100 + i % 1000 for i in range(context)), 0, ())], kv), kv)
        times = []
        for i in range(steps):
            start = kv.reserve(0, 1)
            batch = build_batch([SeqChunk(0, (500 + i,), start, (0,))], kv)
            t = time.perf_counter()
            lm.model(batch, kv)
            times.append((time.perf_counter() - t) * 1e3)
        return times

    out: queue.Queue[list[float]] = queue.Queue()
    lane = threading.Thread(target=lambda: out.put(decode()), name="lane")
    lane.start()
    lane.join()
    return out.get()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--context", type=int, default=300)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=2, help="subprocesses per setting, interleaved")
    p.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="result JSON (default benchmarks/results/threads-DATE.json)")
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child, args.model, args.context, args.steps)))
        return
    load_before = load_average()
    runs: dict[str, list[list[float]]] = {name: [] for name in SETTINGS}
    for _ in range(args.repeats):
        for name, (main_threads, lane_threads) in SETTINGS.items():
            cmd = [sys.executable, "-m", "interlock.benchmarks.thread_check", "--model", args.model,
                   "--context", str(args.context), "--steps", str(args.steps),
                   "--child", str(main_threads), str(lane_threads)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))

    def median(xs: list[float]) -> float:
        return percentile(xs, 50)

    rows = []
    base = median([t for r in runs["lane1"] for t in r])
    for name, (main_threads, lane_threads) in SETTINGS.items():
        ms = median([t for r in runs[name] for t in r])
        rows.append({"setting": name, "main_threads": main_threads, "lane_threads": lane_threads,
                     "decode_ms_p50": round(ms, 2), "speedup_vs_lane1": round(base / ms, 2),
                     "per_run_p50": [round(median(r), 2) for r in runs[name]]})
    result = {"model": args.model, "context": args.context, "steps": args.steps, "repeats": args.repeats,
              "load_average_before": load_before, "load_average_after": load_average(), "rows": rows,
              "raw_ms": runs}
    keys = ["setting", "main_threads", "lane_threads", "decode_ms_p50", "speedup_vs_lane1", "per_run_p50"]
    print_table(f"decode step on a lane thread, {args.model}, context {args.context}", keys,
                [[r[k] for k in keys] for r in rows])
    out = Path(args.out) if args.out else RESULTS / f"threads-{date.today().isoformat()}.json"
    out.write_text(json.dumps(result, indent=1))
    print_json_last({k: v for k, v in result.items() if k != "raw_ms"} | {"saved": str(out)})


if __name__ == "__main__":
    main()
