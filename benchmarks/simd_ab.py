"""The native CPU kernels with their SIMD paths against the same kernels built without any
(INTERLOCK_SIMD=0, kernels/csrc/simd.h): step costs of the embedded model by context.

    python -m interlock.benchmarks.simd_ab --contexts 0,500,1500 --rounds 3 --repeats 7

The kernels are built once per process, so each side runs in a child process; the sides alternate
round by round (simd first in even rounds) so that drift on a shared host hits both alike. A child
measures, per context, one decode step (1 row) and one 4-row verify step (step_costs.step_s: the
cache rewound after each, medians over --repeats) and the weight-streaming floor. The table gives
each side's median over the rounds and the ratio; the raw per-round figures go to
benchmarks/results/simd-ab-<date>.json (`--out`).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

from interlock.benchmarks.common import load_average, median, print_json_last, print_table
from interlock.models.names import EMBEDDED

RESULTS = Path(__file__).resolve().parent / "results"
SIDES = {"simd": "1", "portable": "0"}


def child(model: str, contexts: list[int], repeats: int, threads: int) -> dict:
    import torch

    from interlock.benchmarks import step_costs
    from interlock.kernels import native
    from interlock.models.loader import load_model

    torch.set_num_threads(threads)
    lm = load_model(model)
    steps = {str(c): {"decode_ms": step_costs.step_s(lm.model, c, 1, repeats) * 1e3,
                      "verify4_ms": step_costs.step_s(lm.model, c, 4, repeats) * 1e3} for c in contexts}
    return {"kernel": native.int8_kernel(), "floor_ms": step_costs.weight_floor_s(lm.model, repeats) * 1e3,
            "steps": steps}


def run_side(side: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "interlock.benchmarks.simd_ab", "--child", "--model", args.model,
           "--contexts", ",".join(map(str, args.contexts)), "--repeats", str(args.repeats),
           "--threads", str(args.threads)]
    done = subprocess.run(cmd, env={**os.environ, "INTERLOCK_SIMD": SIDES[side]}, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=EMBEDDED)
    p.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=[0, 500, 1500])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=7, help="timed steps per figure in a child (median)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (the engine's model lane: 2)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.model, args.contexts, args.repeats, args.threads)))
        return
    load_before = load_average()
    rounds: list[dict[str, dict]] = []
    for r in range(args.rounds):
        order = list(SIDES) if r % 2 == 0 else list(reversed(SIDES))
        rounds.append({side: run_side(side, args) for side in order})
    kernels = {side: rounds[0][side]["kernel"] for side in SIDES}
    rows, summary = [], {}
    for c in map(str, args.contexts):
        for step in ("decode_ms", "verify4_ms"):
            simd, portable = (median([rd[side]["steps"][c][step] for rd in rounds]) for side in SIDES)
            rows.append((c, step.removesuffix("_ms"), round(portable, 2), round(simd, 2), portable / simd))
            # 4 decimals: a tiny model's steps are fractions of a ms, where 2 decimals misstate the ratio
            summary[f"ctx{c}_{step}"] = {"portable": round(portable, 4), "simd": round(simd, 4),
                                        "speedup": round(portable / simd, 2)}
    floor = median([rd["simd"]["floor_ms"] for rd in rounds])
    print_table(f"step costs, {args.threads} thread(s), kernels {kernels}, weight floor {floor:.2f} ms, "
                f"load {load_average()}",
                ["context", "step", "without SIMD ms", "with SIMD ms", "speed-up"], rows)
    out = args.out or RESULTS / f"simd-ab-{datetime.date.today()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "out"}, "kernels": kernels,
                               "floor_ms": floor, "load_before": load_before, "load_after": load_average(),
                               "summary": summary, "rounds": rounds}, indent=1))
    print_json_last({"file": str(out), **summary})


if __name__ == "__main__":
    main()
