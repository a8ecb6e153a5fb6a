"""`python -m interlock.benchmarks.head_ab`: greedy constrained decoding with the grammar-told head
(Transformer.head_argmax: rows whose mask allows few ids compute only those logits) against the
dense head, alternating in one process.

The switch is the model's `sparse_head`: off, the verifier computes every logit before the masks
arrive, as before. Everything else is the same engine on the same rows (`interlock bench`'s,
benchmarks/engine_bench.py), and the runs alternate (dense, sparse, sparse, dense, ...) so this
host's drift falls on both. Greedy outputs must be the same tokens either way (the head computes
the same bits). Prints each setting's median tokens/s and their ratio; saves the JSON, token ids
included, under benchmarks/results/.
"""
from __future__ import annotations

import argparse
import json
from datetime import date
from pathlib import Path

import anyio
import torch

from interlock.benchmarks.common import load_average, median, print_json_last, print_table
from interlock.benchmarks.engine_bench import BenchConfig, run_bench
from interlock.benchmarks.prompts import DATASETS
from interlock.logs import configure_logging
from interlock.models.llama import Transformer
from interlock.models.loader import EMBEDDED, load_model

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", type=Path, default=DATASETS / "JME.jsonl")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--speculative", default="none,ngram+forced", help="modes, comma-separated, each A/B'd")
    p.add_argument("--rounds", type=int, default=3, help="runs of each setting (medians), alternating")
    p.add_argument("--out", default=None, help="result JSON (default benchmarks/results/head-ab-DATE.json)")
    args = p.parse_args()
    configure_logging(level="warning")
    torch.set_num_threads(1)            # before loading: the engine's model lane gets 2 (engine.lane_threads)
    loaded = load_model(EMBEDDED)
    if not loaded.model.sparse_head:
        p.error("this model has no native int8 head here (the native kernels did not build): nothing to compare")
    sparse = Transformer.sparse_head
    load_before = load_average()
    modes = []
    for mode in args.speculative.split(","):
        cfg = BenchConfig(dataset=args.dataset, limit=args.limit, speculative=mode)
        runs: dict[str, list[dict]] = {"dense": [], "sparse": []}
        try:
            for r in range(args.rounds):
                for name in ("dense", "sparse") if r % 2 == 0 else ("sparse", "dense"):
                    Transformer.sparse_head = sparse if name == "sparse" else property(lambda self: False)
                    runs[name].append(anyio.run(run_bench, loaded, cfg, False))
        finally:
            Transformer.sparse_head = sparse
        outputs = [[o["token_ids"] for o in x["outputs"]] for x in runs["dense"] + runs["sparse"]]
        row = {"mode": mode, **{f"{n}_tokens_per_s": round(median([x["tokens_per_s"] for x in runs[n]]), 2)
                                for n in runs},
               **{f"{n}_runs": [x["tokens_per_s"] for x in runs[n]] for n in runs},
               "same_outputs": all(o == outputs[0] for o in outputs)}
        row["sparse_over_dense"] = round(row["sparse_tokens_per_s"] / row["dense_tokens_per_s"], 3)
        modes.append((row, runs))
    result = {"dataset": args.dataset.stem, "limit": args.limit, "rounds": args.rounds,
              "load_average_before": load_before, "load_average_after": load_average(),
              "modes": [row for row, _ in modes], "runs": [runs for _, runs in modes]}
    out = Path(args.out) if args.out else RESULTS / f"head-ab-{date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result))
    keys = ["mode", "dense_tokens_per_s", "sparse_tokens_per_s", "sparse_over_dense", "same_outputs"]
    print_table(f"{args.limit} {args.dataset.stem} rows, dense vs grammar-told head, alternating, median of {args.rounds}",
                keys, [[row[k] for k in keys] for row, _ in modes])
    print_json_last({k: v for k, v in result.items() if k != "runs"} | {"saved": str(out)})


if __name__ == "__main__":
    main()
