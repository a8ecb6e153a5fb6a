"""`python -m interlock.benchmarks.engine_ab --base REV`: the engine end to end with REV's native CPU
kernels against this checkout's, alternating in one process.

On a host whose speed moves 10-20% from minute to minute, two `interlock bench` runs cannot show a
5% kernel gain. Here both kernel sets are built from their csrc/ (REV's read from git) under op
namespaces of their own, and before each run `torch.ops.interlock_cpu` is pointed at one of them:
everything else -- engine, scheduler, model code, prompts -- is this checkout's, and the runs
alternate (base, now, now, base, ...) so drift falls on both. Each run is `interlock bench`'s
(benchmarks/engine_bench.py) on the same rows through a fresh engine. Prints each version's median
tokens/s and TTFT p50, their ratios, and whether the two gave the same tokens (kernels that keep the
bits must); saves the JSON, token ids included, under benchmarks/results/.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import tempfile
from datetime import date
from pathlib import Path

import torch

from interlock.benchmarks.common import load_average, median, print_json_last, print_table
from interlock.benchmarks.engine_bench import BenchConfig, alternate, same_tokens
from interlock.benchmarks.prompts import DATASETS
from interlock.kernels import native
from interlock.logs import configure_logging
from interlock.models.loader import EMBEDDED, load_model

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "kernels" / "csrc"
RESULTS = Path(__file__).resolve().parent / "results"


def renamed_library(text: str, namespace: str) -> str:
    """ops.cpp's registrations under `namespace` instead of interlock_cpu (its C++ stays as it is:
    each build is its own shared library)."""
    return (text.replace("TORCH_LIBRARY(interlock_cpu,", f"TORCH_LIBRARY({namespace},")
                .replace("TORCH_LIBRARY_IMPL(interlock_cpu,", f"TORCH_LIBRARY_IMPL({namespace},"))


def build(rev: str | None, namespace: str) -> None:
    """Build csrc/ at `rev` (None: this checkout) registering torch.ops.<namespace>.*."""
    folder = Path(tempfile.mkdtemp(prefix=f"engine_ab_{namespace}_"))
    if rev is None:
        files = {p.name: p.read_text() for p in CSRC.iterdir()}
    else:
        names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:kernels/csrc"], cwd=ROOT, check=True,
                               capture_output=True, text=True).stdout.split()
        files = {n: subprocess.run(["git", "show", f"{rev}:kernels/csrc/{n}"], cwd=ROOT, check=True,
                                   capture_output=True, text=True).stdout for n in names}
    files["ops.cpp"] = renamed_library(files["ops.cpp"], namespace)
    for name, text in files.items():
        (folder / name).write_text(text)
    digest = hashlib.sha256("".join(files[n] for n in sorted(files)).encode()).hexdigest()[:12]
    from torch.utils.cpp_extension import load

    load(name=f"{namespace}_{digest}", sources=[str(folder / "ops.cpp")], extra_cflags=native.CFLAGS,
         extra_ldflags=native.LDFLAGS, is_python_module=False, verbose=False, build_directory=str(folder))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the git revision whose kernels to compare with this checkout's")
    p.add_argument("--dataset", type=Path, default=DATASETS / "JME.jsonl")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--speculative", default="ngram+forced")
    p.add_argument("--rounds", type=int, default=3, help="runs of each version (medians), alternating")
    p.add_argument("--out", default=None, help="result JSON (default benchmarks/results/engine-ab-DATE.json)")
    args = p.parse_args()
    configure_logging(level="warning")
    torch.set_num_threads(1)            # before loading: the engine's model lane gets 2 (engine.lane_threads)
    if not native.available():
        p.error("the native CPU kernels do not build here: nothing to compare")
    found = subprocess.run(["git", "rev-parse", "--short", "--verify", f"{args.base}^{{commit}}"], cwd=CSRC,
                           capture_output=True, text=True)
    if found.returncode != 0:
        p.error(f"--base {args.base!r} is not a commit of this checkout's git history")
    base = found.stdout.strip()
    build(base, "interlock_cpu_base")
    build(None, "interlock_cpu_now")
    versions = {"base": torch.ops.interlock_cpu_base, "now": torch.ops.interlock_cpu_now}
    missing = [op for op in native.OPS if not hasattr(versions["base"], op)]
    if missing:        # this checkout's engine would call them and fail mid-run
        p.error(f"the kernels of {base} lack {', '.join(missing)}, which this checkout calls: pick a later --base")
    loaded = load_model(EMBEDDED)
    cfg = BenchConfig(dataset=args.dataset, limit=args.limit, speculative=args.speculative)
    load_before = load_average()
    own = torch.ops.interlock_cpu

    def use(name: str) -> None:
        torch.ops.interlock_cpu = versions[name]        # every call site looks the namespace up per call
    try:
        runs = alternate(loaded, cfg, args.rounds, ("base", "now"), use)
    finally:
        torch.ops.interlock_cpu = own
    summary = {}
    for name, results in runs.items():
        summary[name] = {"tokens_per_s": round(median([x["tokens_per_s"] for x in results]), 2),
                         "ttft_p50_s": round(median([x["ttft_p50_s"] for x in results]), 4),
                         "runs_tokens_per_s": [x["tokens_per_s"] for x in results]}
    result = {"base": base, "dataset": args.dataset.stem, "limit": args.limit, "speculative": args.speculative,
              "rounds": args.rounds, "load_average_before": load_before, "load_average_after": load_average(),
              **summary,
              "now_over_base_tokens_per_s": round(summary["now"]["tokens_per_s"] / summary["base"]["tokens_per_s"], 3),
              "base_over_now_ttft": round(summary["base"]["ttft_p50_s"] / summary["now"]["ttft_p50_s"], 3),
              "same_outputs": same_tokens(runs),
              "runs": runs}
    out = Path(args.out) if args.out else RESULTS / f"engine-ab-{date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result))
    print_table(f"{args.speculative} on {args.limit} {args.dataset.stem} rows: kernels of {base} vs this checkout, "
                f"alternating, median of {args.rounds}", ["version", "tokens_per_s", "ttft_p50_s", "runs"],
                [[n, summary[n]["tokens_per_s"], summary[n]["ttft_p50_s"], summary[n]["runs_tokens_per_s"]]
                 for n in ("base", "now")])
    print_json_last({k: v for k, v in result.items() if k != "runs"} | {"saved": str(out)})


if __name__ == "__main__":
    main()
