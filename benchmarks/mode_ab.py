"""`python -m interlock.benchmarks.mode_ab --modes A,B`: two speculative modes on the same rows,
alternating in one process (A, B, B, A, ...), so this host's drift falls on both.

`interlock bench --speculative A,B` runs the modes one after the other, which on a machine whose
speed moves 10-20% in minutes cannot tell a 5% difference. Greedy speculation is exact, so both
modes must give every row the same tokens (`same_outputs`). Prints each mode's median tokens/s,
acceptance and TTFT p50 and their ratio; saves the JSON, token ids included, under
benchmarks/results/.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from datetime import date
from pathlib import Path

import torch

from interlock.benchmarks.common import load_average, median, print_json_last, print_table
from interlock.benchmarks.engine_bench import add_workload_args, alternate, same_tokens, workload
from interlock.logs import configure_logging
from interlock.models.loader import EMBEDDED, load_model

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", required=True, help="two modes, comma-separated, e.g. ngram+forced,suffix+forced")
    add_workload_args(p)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3, help="runs of each mode (medians), alternating")
    p.add_argument("--out", default=None, help="result JSON (default benchmarks/results/mode-ab-DATE.json)")
    args = p.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if len(modes) != 2 or modes[0] == modes[1]:
        p.error("--modes needs two different modes, e.g. ngram+forced,suffix+forced")
    base, what = workload(p, args)
    configure_logging(level="warning")
    torch.set_num_threads(1)            # before loading: the engine's model lane gets 2 (engine.lane_threads)
    loaded = load_model(EMBEDDED)
    cfg = replace(base, max_tokens=args.max_tokens)
    load_before = load_average()
    runs = alternate(loaded, cfg, args.rounds, (modes[0], modes[1]), lambda mode: replace(cfg, speculative=mode))
    rows = [{"mode": m, "tokens_per_s": round(median([x["tokens_per_s"] for x in runs[m]]), 2),
             "runs": [x["tokens_per_s"] for x in runs[m]],
             "ttft_p50_s": round(median([x["ttft_p50_s"] for x in runs[m]]), 4),
             "acceptance": runs[m][0]["mean_acceptance_length"], "engine_steps": runs[m][0]["engine_steps"]}
            for m in modes]
    for row in rows:
        row["ratio"] = round(row["tokens_per_s"] / rows[0]["tokens_per_s"], 3)
    result = {"modes": rows, "dataset": args.dataset.stem, "limit": args.limit, "repeat_schema": args.repeat_schema,
              "repeats": args.repeats, "max_tokens": args.max_tokens, "rounds": args.rounds,
              "same_outputs": same_tokens(runs), "load_average_before": load_before,
              "load_average_after": load_average(), "results": runs}
    out = Path(args.out) if args.out else RESULTS / f"mode-ab-{date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result))
    keys = ["mode", "tokens_per_s", "ratio", "acceptance", "ttft_p50_s", "engine_steps"]
    print_table(f"{what}, alternating, median of {args.rounds}; same outputs: {result['same_outputs']}",
                keys, [[row[k] for k in keys] for row in rows])
    print_json_last({k: v for k, v in result.items() if k != "results"} | {"saved": str(out)})


if __name__ == "__main__":
    main()
