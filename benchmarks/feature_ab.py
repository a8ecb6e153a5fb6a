"""`python -m interlock.benchmarks.feature_ab --feature NAME`: the engine with one step feature on
against off, alternating in one process.

Features (each exact: greedy outputs are the same tokens either way):
- head: the grammar-told head (Transformer.head_argmax: greedy rows whose mask allows few ids
  compute only those logits); off, the verifier computes every logit before the masks arrive.
- draft-check: the grammar lane cuts each request's drafts at the first one its grammar refuses
  before the forward (GrammarActor.check); off, the forward computes those rows and the verifier
  never reads them.
- long-drafts: the suffix drafter drafts past K where its match is as long as the draft
  (SuffixConfig.max_long_draft); off, K caps every draft (max_long_draft 0). Only modes with
  "suffix" differ. `--repeats 3` runs each prompt three times in a row, as a benchmark's warm-up and
  timed runs do; `--repeat-schema ROW`, one schema over --limit documents.

Everything else is the same engine on the same rows (`interlock bench`'s, benchmarks/engine_bench.py),
and the runs alternate (off, on, on, off, ...) so this host's drift falls on both. Prints each
setting's median tokens/s and their ratio; saves the JSON, token ids included, under
benchmarks/results/.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import replace
from datetime import date
from pathlib import Path

import torch

from interlock.benchmarks.common import load_average, median, print_json_last, print_table
from interlock.benchmarks.engine_bench import BenchConfig, add_workload_args, alternate, same_tokens, workload
from interlock.actors.grammar_actor import GrammarActor
from interlock.logs import configure_logging
from interlock.models.llama import Transformer
from interlock.models.loader import EMBEDDED, load_model
from interlock.protocol.speculative import SuffixConfig

RESULTS = Path(__file__).resolve().parent / "results"
Side = Callable[[str, BenchConfig], BenchConfig]       # ("on" / "off", the config) -> the config to run


def patched(cls: type, name: str, off: object) -> Side:
    """A feature that is a class attribute: `off` stands in for it while off (put back on "on")."""
    on = cls.__dict__[name]

    def side(setting: str, cfg: BenchConfig) -> BenchConfig:
        setattr(cls, name, on if setting == "on" else off)
        return cfg
    return side


def long_drafts(setting: str, cfg: BenchConfig) -> BenchConfig:
    return replace(cfg, suffix=None if setting == "on" else SuffixConfig(max_long_draft=0))


FEATURES: dict[str, Side] = {"head": patched(Transformer, "sparse_head", property(lambda self: False)),
                             "draft-check": patched(GrammarActor, "check", lambda self: None),
                             "long-drafts": long_drafts}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--feature", choices=sorted(FEATURES), required=True)
    add_workload_args(p)
    p.add_argument("--speculative", default="none,ngram+forced", help="modes, comma-separated, each A/B'd")
    p.add_argument("--rounds", type=int, default=3, help="runs of each setting (medians), alternating")
    p.add_argument("--out", default=None, help="result JSON (default benchmarks/results/feature-ab-NAME-DATE.json)")
    args = p.parse_args()
    base, what = workload(p, args)
    configure_logging(level="warning")
    torch.set_num_threads(1)            # before loading: the engine's model lane gets 2 (engine.lane_threads)
    loaded = load_model(EMBEDDED)
    if args.feature == "head" and not loaded.model.sparse_head:
        p.error("this model has no native int8 head here (the native kernels did not build): nothing to compare")
    side = FEATURES[args.feature]
    load_before = load_average()
    modes = []
    for mode in args.speculative.split(","):
        cfg = replace(base, speculative=mode)
        try:
            runs = alternate(loaded, cfg, args.rounds, ("off", "on"), lambda setting: side(setting, cfg))
        finally:
            side("on", cfg)
        row = {"mode": mode, **{f"{n}_tokens_per_s": round(median([x["tokens_per_s"] for x in runs[n]]), 2)
                                for n in runs},
               **{f"{n}_acceptance": runs[n][0]["mean_acceptance_length"] for n in runs},
               **{f"{n}_runs": [x["tokens_per_s"] for x in runs[n]] for n in runs},
               "on_engine_steps": runs["on"][0]["engine_steps"], "off_engine_steps": runs["off"][0]["engine_steps"],
               "same_outputs": same_tokens(runs)}
        row["on_over_off"] = round(row["on_tokens_per_s"] / row["off_tokens_per_s"], 3)
        modes.append((row, runs))
    result = {"feature": args.feature, "dataset": args.dataset.stem, "limit": args.limit, "rounds": args.rounds,
              "repeat_schema": args.repeat_schema, "repeats": args.repeats,
              "load_average_before": load_before, "load_average_after": load_average(),
              "modes": [row for row, _ in modes], "runs": [runs for _, runs in modes]}
    out = Path(args.out) if args.out else RESULTS / f"feature-ab-{args.feature}-{date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result))
    keys = ["mode", "off_tokens_per_s", "on_tokens_per_s", "on_over_off", "off_acceptance", "on_acceptance",
            "same_outputs"]
    print_table(f"{what}, {args.feature} off vs on, alternating, median of {args.rounds}",
                keys, [[row[k] for k in keys] for row, _ in modes])
    print_json_last({k: v for k, v in result.items() if k != "runs"} | {"saved": str(out)})


if __name__ == "__main__":
    main()
