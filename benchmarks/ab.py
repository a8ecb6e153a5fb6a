"""`python -m interlock.benchmarks.ab --side FLAGS --side FLAGS ...`: engine configurations on the same
rows, alternating in one process, so a drifting host's speed falls on every side alike.

Each side is a string of engine flags (the names `interlock bench` and the CLI use), applied over the
workload's defaults; nothing else differs between the sides:

    --speculative MODE  --draft-len K  --prefill auto|rows|dense  --prefix-caching on|off
    --kv-cache-dtype auto|float32|float16|bfloat16  --threads N  --backend B  --max-long-draft N
    --masks batched|rows  (GrammarConfig.batched_masks: the step's grammar work in one pass, or per request)
    --concurrency N  (requests in flight, the engine's batch; default the script's --concurrency)

For example: prompt lookup against suffix drafts, long suffix drafts off and on, the two prompt paths:

    python -m interlock.benchmarks.ab --side "--speculative ngram+forced" --side "--speculative suffix+forced"
    python -m interlock.benchmarks.ab --repeats 3 --side "--speculative suffix+forced --max-long-draft 0" \\
        --side "--speculative suffix+forced"
    python -m interlock.benchmarks.ab --repeat-schema JME_26 --side "--prefill dense" --side "--prefill rows"
    python -m interlock.benchmarks.ab --side "--masks rows --concurrency 1" --side "--masks batched --concurrency 1" \\
        --side "--masks rows --concurrency 8" --side "--masks batched --concurrency 8"

`interlock bench --speculative A,B --rounds N` alternates speculative modes the same way; this script
alternates any engine option. The sides run in the order given, then reversed, for --rounds rounds
(`engine_bench.round_order`), each run through a fresh engine on one loaded model (one per
--kv-cache-dtype). Prints each side's median tokens/s, its ratio to the first side, acceptance, TTFT p50
and steps, and whether every run gave every row the same tokens (greedy sides that keep the numerics
must); saves the JSON, token ids included, under benchmarks/results/.
"""
from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import replace
from datetime import date
from pathlib import Path

import anyio
import torch

from interlock.benchmarks.common import cpu_name, load_average, median, print_json_last, print_table
from interlock.benchmarks.engine_bench import (BenchConfig, add_workload_args, round_order, run_bench, same_tokens,
                                               workload)
from interlock.logs import configure_logging
from interlock.models.loader import EMBEDDED, load_model
from interlock.protocol.errors import InterlockError
from interlock.protocol.grammar import BACKENDS
from interlock.protocol.speculative import SpeculativeConfig, SuffixConfig
from interlock.protocol.types import PREFILL_MODES

RESULTS = Path(__file__).resolve().parent / "results"


def side_parser() -> argparse.ArgumentParser:
    """The flags one side may set; every default is None: "as the workload has it"."""
    p = argparse.ArgumentParser(prog="--side", add_help=False, exit_on_error=False)
    p.add_argument("--speculative")
    p.add_argument("--draft-len", type=int)
    p.add_argument("--prefill", choices=PREFILL_MODES)
    p.add_argument("--prefix-caching", choices=["on", "off"])
    p.add_argument("--kv-cache-dtype", choices=["auto", "float32", "float16", "bfloat16"])
    p.add_argument("--threads", type=int)
    p.add_argument("--backend", choices=BACKENDS)
    p.add_argument("--max-long-draft", type=int, help="SuffixConfig.max_long_draft (0: K caps every suffix draft)")
    p.add_argument("--masks", choices=["batched", "rows"], help="GrammarConfig.batched_masks")
    p.add_argument("--concurrency", type=int, help="requests in flight (the engine's batch)")
    return p


def parse_side(flags: str, base: BenchConfig) -> tuple[BenchConfig, str]:
    """(the side's BenchConfig over `base`, its KV dtype: "auto" for the loader's default).
    Raises ValueError naming what is wrong with the flags."""
    try:
        ns, unknown = side_parser().parse_known_args(shlex.split(flags))
    except argparse.ArgumentError as exc:
        raise ValueError(f"{flags!r}: {exc}") from None
    if unknown:
        raise ValueError(f"{flags!r}: not a side's flag: {' '.join(unknown)}")
    if ns.concurrency is not None and ns.concurrency < 1:
        raise ValueError(f"{flags!r}: --concurrency must be >= 1")
    fields = {k: v for k, v in {"speculative": ns.speculative, "draft_len": ns.draft_len, "prefill": ns.prefill,
                                "threads": ns.threads, "backend": ns.backend,
                                "concurrency": ns.concurrency}.items() if v is not None}
    if ns.prefix_caching is not None:
        fields["prefix_caching"] = ns.prefix_caching == "on"
    if ns.masks is not None:
        fields["batched_masks"] = ns.masks == "batched"
    if ns.max_long_draft is not None:
        fields["suffix"] = SuffixConfig(max_long_draft=ns.max_long_draft)
    cfg = replace(base, **fields)
    try:                                # a bad mode is a usage error before any model loads
        SpeculativeConfig.parse(cfg.speculative, max_draft_len=cfg.draft_len)
    except (ValueError, InterlockError) as exc:
        raise ValueError(f"{flags!r}: {exc}") from None
    return cfg, ns.kv_cache_dtype or "auto"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--side", action="append", default=[], metavar="FLAGS",
                   help="one configuration as engine flags (quoted); give two or more")
    add_workload_args(p)
    p.add_argument("--speculative", default="ngram+forced", help="the mode of sides that do not name one")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight (the engine's batch)")
    p.add_argument("--rounds", type=int, default=3, help="runs of each side (medians), alternating")
    p.add_argument("--out", default=None, help="result JSON (default benchmarks/results/ab-DATE.json)")
    args = p.parse_args()
    if len(args.side) < 2 or len(set(args.side)) != len(args.side):
        p.error("--side needs two or more different configurations, e.g. --side '--prefill dense' --side '--prefill rows'")
    if args.rounds < 1:
        p.error("argument --rounds: must be >= 1")
    base, what = workload(p, args)
    base = replace(base, speculative=args.speculative, max_tokens=args.max_tokens, concurrency=args.concurrency)
    sides = {}
    for flags in args.side:
        try:
            sides[flags] = parse_side(flags, base)
        except ValueError as exc:
            p.error(f"argument --side: {exc}")
    configure_logging(level="warning")
    torch.set_num_threads(1)            # before loading: the engine's model lane gets its own threads
    models = {kv: load_model(EMBEDDED, kv_dtype=None if kv == "auto" else kv) for kv in {kv for _, kv in sides.values()}}
    load_before = load_average()
    runs: dict[str, list[dict]] = {flags: [] for flags in args.side}
    for r in range(args.rounds):
        for flags in round_order(args.side, r):
            cfg, kv = sides[flags]
            runs[flags].append(anyio.run(run_bench, models[kv], cfg, False) | {"load_average_after": load_average()})
    rows = [{"side": flags, "concurrency": sides[flags][0].concurrency,
             "tokens_per_s": round(median([x["tokens_per_s"] for x in runs[flags]]), 2),
             "runs": [x["tokens_per_s"] for x in runs[flags]],
             "ttft_p50_s": round(median([x["ttft_p50_s"] for x in runs[flags]]), 4),
             "acceptance": runs[flags][0]["mean_acceptance_length"], "engine_steps": runs[flags][0]["engine_steps"],
             "host_ms_per_step": round(median([x["host_ms_per_step"] for x in runs[flags]]), 3),
             "exposed_grammar_frac": round(median([x["exposed_grammar_frac"] for x in runs[flags]]), 4),
             "valid": runs[flags][0]["valid"]} for flags in args.side]
    for row in rows:
        row["ratio"] = round(row["tokens_per_s"] / max(rows[0]["tokens_per_s"], 1e-9), 3)
    result = {"sides": rows, "cpu": cpu_name(), "dataset": args.dataset.stem, "limit": args.limit,
              "concurrency": args.concurrency, "repeat_schema": args.repeat_schema,
              "repeats": args.repeats, "max_tokens": args.max_tokens, "rounds": args.rounds,
              "same_outputs": same_tokens(runs), "load_average_before": load_before,
              "load_average_after": load_average(), "results": runs}
    out = Path(args.out) if args.out else RESULTS / f"ab-{date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result))
    keys = ["side", "concurrency", "tokens_per_s", "ratio", "acceptance", "ttft_p50_s", "engine_steps",
            "host_ms_per_step", "exposed_grammar_frac", "valid"]
    print_table(f"{what}, alternating, median of {args.rounds}; same outputs: {result['same_outputs']}",
                keys, [[row[k] for k in keys] for row in rows])
    print_json_last({k: v for k, v in result.items() if k != "results"} | {"saved": str(out)})


if __name__ == "__main__":
    main()
