"""The native int8_linear of this checkout against another revision's, shape by shape.

    python -m interlock.benchmarks.int8_ab --old main --kernels amx,vnni --rounds 3

Each side is the C++ in kernels/csrc (the other revision's read with `git show`) built into a
library of its own, so each runs in a child process; for every kernel (amx: the machine's default
where it has the tiles, vnni: INTERLOCK_AMX=0, avx2: INTERLOCK_SIMD=avx2, portable: INTERLOCK_SIMD=0)
the sides alternate round by round (new first in even rounds) so that drift on a shared host hits
both alike. A child times torch.ops.interlock_cpu.int8_linear on random int8 weights per shape
(M rows, K, N), cycling through copies of the weights that add up to --pool-mb so that they stream
from beyond L2 as a model's do; each figure is the median over --repeats of a call's mean time. By
default one thread and its CPU time (time.thread_time): on a shared host a wall clock mostly
measures the waits for a core (and OpenMP's threads wait for each other), CPU time leaves them out.
The default shapes are SmolLM2-135M's projections (K = 576; N = 576, 1536, the 49,152-id head) and a
1B model's up projection (K = 2048, N = 8192) at 1, 4, 16 and 256 rows: decode, verify, a short
and a whole prompt chunk. Saves the raw per-round figures to benchmarks/results/int8-ab-<date>.json
(`--out`).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from interlock.benchmarks.common import load_average, median, print_json_last, print_table

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
KERNEL_ENVS = {"amx": {}, "vnni": {"INTERLOCK_AMX": "0"}, "avx2": {"INTERLOCK_SIMD": "avx2"},
               "portable": {"INTERLOCK_SIMD": "0"}}
SHAPES = [(m, k, n) for k, n in ((576, 576), (576, 1536), (576, 49152), (2048, 8192)) for m in (1, 4, 16, 256)]


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """"M:K:N,M:K:N,..." -> [(M, K, N), ...]."""
    shapes = [tuple(int(v) for v in part.split(":")) for part in text.split(",")]
    if any(len(s) != 3 or min(s) < 1 or s[1] % 32 for s in shapes):
        raise argparse.ArgumentTypeError(f"shapes are M:K:N with K a multiple of 32, got {text!r}")
    return shapes


def old_sources(rev: str, into: Path) -> Path:
    """kernels/csrc at git revision `rev` written under `into`."""
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{rev}:kernels/csrc"],
                           capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        data = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:kernels/csrc/{name}"], capture_output=True,
                              check=True).stdout
        (into / name).write_bytes(data)
    return into


def child(csrc: Path, shapes: list[tuple[int, int, int]], repeats: int, threads: int, pool_mb: int,
          clock_name: str) -> dict:
    import torch
    from torch.utils.cpp_extension import load

    from interlock.kernels import native

    torch.set_num_threads(threads)
    files = b"".join(p.read_bytes() for p in sorted(csrc.iterdir()))
    digest = hashlib.sha256(files + str(csrc).encode()).hexdigest()[:12]
    simd = os.environ.get("INTERLOCK_SIMD", "1")
    flags = {"0": ["-DINTERLOCK_NO_SIMD"], "avx2": native.AVX2_ONLY}.get(simd, [])
    load(name=f"interlock_ab_{digest}_{simd}", sources=[str(csrc / "ops.cpp")], extra_cflags=native.CFLAGS + flags,
         extra_ldflags=native.LDFLAGS, is_python_module=False, verbose=False)
    op = torch.ops.interlock_cpu.int8_linear
    clock = time.thread_time if clock_name == "cpu" else time.perf_counter
    gen = torch.Generator().manual_seed(0)
    figures = {}
    for m, k, n in shapes:
        copies = max(1, -(-pool_mb * 2**20 // (n * k)))
        weights = [torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8) for _ in range(copies)]
        scale = torch.rand(n, generator=gen) * 0.01
        x = torch.randn(m, k, generator=gen)
        start = time.perf_counter()
        for w in weights:
            op(x, w, scale)                                             # warm: scratch, pages, the pool
        calls = max(copies, int(0.05 * copies / (time.perf_counter() - start)))    # ~50 ms per repeat
        means = []
        for _ in range(repeats):
            start = clock()
            for i in range(calls):
                op(x, weights[i % copies], scale)
            means.append((clock() - start) / calls)
        figures[f"{m}:{k}:{n}"] = median(means) * 1e6
    return {"kernel": torch.ops.interlock_cpu.int8_kernel(), "us": figures}


def run_side(csrc: Path, kernel: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "interlock.benchmarks.int8_ab", "--child", str(csrc),
           "--shapes", ",".join(f"{m}:{k}:{n}" for m, k, n in args.shapes), "--repeats", str(args.repeats),
           "--threads", str(args.threads), "--pool-mb", str(args.pool_mb), "--clock", args.clock]
    done = subprocess.run(cmd, env={**os.environ, **KERNEL_ENVS[kernel]}, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", default="main", help="the git revision to compare against (default: main)")
    p.add_argument("--kernels", type=lambda s: s.split(","), default=["amx", "vnni"],
                   help=f"comma-separated, of {', '.join(KERNEL_ENVS)}")
    p.add_argument("--shapes", type=parse_shapes, default=SHAPES, help="M:K:N,... (default: see the docstring)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per figure in a child (median)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the engine's model lane runs 2)")
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                   help="cpu: this thread's CPU time (with --threads 1; what a shared host's waits leave out)")
    p.add_argument("--pool-mb", type=int, default=64, help="weight copies per shape add up to this")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.shapes, args.repeats, args.threads, args.pool_mb, args.clock)))
        return
    if args.clock == "cpu" and args.threads != 1:
        p.error("--clock cpu times one thread: use --threads 1 (or --clock wall)")
    if unknown := set(args.kernels) - set(KERNEL_ENVS):
        p.error(f"--kernels: unknown {sorted(unknown)}; known: {', '.join(KERNEL_ENVS)}")
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="int8-ab-") as tmp:
        sides = {"new": ROOT / "kernels" / "csrc", "old": old_sources(args.old, Path(tmp))}
        rounds: list[dict[str, dict[str, dict]]] = []
        for r in range(args.rounds):
            order = ["new", "old"] if r % 2 == 0 else ["old", "new"]
            rounds.append({kernel: {side: run_side(sides[side], kernel, args) for side in order}
                           for kernel in args.kernels})
    ran = {kernel: {side: rounds[0][kernel][side]["kernel"] for side in ("old", "new")} for kernel in args.kernels}
    rows, summary = [], {}
    for kernel in args.kernels:
        for m, k, n in args.shapes:
            key = f"{m}:{k}:{n}"
            old, new = (median([rd[kernel][side]["us"][key] for rd in rounds]) for side in ("old", "new"))
            rows.append((kernel, m, k, n, round(old, 1), round(new, 1), old / new))
            summary[f"{kernel}_{key}"] = {"old_us": round(old, 2), "new_us": round(new, 2),
                                         "speedup": round(old / new, 3)}
    print_table(f"int8_linear, old {args.old} vs this checkout, {args.threads} thread(s), {args.clock} time, "
                f"kernels run {ran}, "
                f"load {load_before} -> {load_average()}",
                ["kernel", "M", "K", "N", "old us", "new us", "old / new"], rows)
    out = args.out or RESULTS / f"int8-ab-{datetime.date.today()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                                        if k != "out"}, "kernels": ran, "load_before": load_before,
                               "load_after": load_average(), "summary": summary, "rounds": rounds}, indent=1))
    print_json_last({"file": str(out), **summary})


if __name__ == "__main__":
    main()
