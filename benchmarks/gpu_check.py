"""Everything a GPU machine should check, in one command that fits in 8 minutes on an H100.

    make gpu-check                              (OUT=dir; installs .whl/ first, see gpu_wheels.py)
    python -m interlock.benchmarks.gpu_check --out DIR [--quick]

In order, each with its own time limit so that one hang cannot take the rest:
1. env.txt: the GPU, driver, torch / triton / xgrammar / llguidance versions;
2. gpu-tests.log + gpu-tests.xml: every CUDA test (timeline and host functions, Triton kernels,
   the device forward) and the engine's exactness and lifecycle laws on the device runner, eager
   and captured (tests/engine/test_device_runner.py runs each law on the CPU and on CUDA);
3. gpu-bench.json: benchmarks/gpu_bench.py, one speculative step hand-built on the CUDA timeline
   (its grammar host is the engine's batched pass, grammars/batch.py);
4. gpu-engine-DATE.json: benchmarks/gpu_engine.py, the engine through `Engine(device="cuda")`;
5. mask-bench.json: benchmarks/mask_bench.py, short, on this machine's cores (for mask_threads' default).
Then summary.txt: each part's exit status and time. Every file lands in --out ($OUT).
"""
from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent          # the repository (the interlock package)
CUDA_TESTS = ["tests/streams/test_cuda_timeline.py", "tests/kernels/test_bitmask_cuda.py",
              "tests/kernels/test_bitmask_vocab_sizes.py", "tests/kernels/test_rejection_cuda.py",
              "tests/kernels/test_rejection_stats.py", "tests/kernels/test_logprobs.py",
              "tests/models/test_device_forward.py",
              "tests/engine/test_device_runner.py"]


def run(name: str, argv: list[str], out: Path, limit_s: int, log: str | None = None) -> tuple[str, int, float]:
    """One part: its output to `log` (and this process's stdout), killed past `limit_s`."""
    start = time.perf_counter()
    print(f"== {name}: {' '.join(argv)}", flush=True)
    with open(out / (log or f"{name}.log"), "w") as f:
        try:
            done = subprocess.run(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=limit_s,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1", "INTERLOCK_NATIVE_KERNELS": "0"})
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = 124
    took = time.perf_counter() - start
    print(f"   {name}: exit {code} in {took:.0f} s", flush=True)
    return name, code, took


def env_report(out: Path) -> None:
    lines = []
    for cmd in (["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                [sys.executable, "-c", "import torch, triton, xgrammar, llguidance, importlib.metadata as m; "
                 "print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, "
                 "'xgrammar', m.version('xgrammar'), 'llguidance', m.version('llguidance'), "
                 "'cpus', __import__('os').cpu_count())"]):
        try:
            lines.append(subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip())
        except OSError as exc:
            lines.append(f"{cmd[0]}: {exc}")
    (out / "env.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-check-out"))
    parser.add_argument("--quick", action="store_true", help="benchmarks at one shape (a smoke run)")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    today = datetime.date.today().isoformat()
    env_report(out)
    py = sys.executable
    quick = ["--quick"] if args.quick else []
    parts = [
        run("gpu-tests", [py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--junitxml={out}/gpu-tests.xml",
                          *CUDA_TESTS], out, 170),
        run("gpu-bench", [py, "-m", "interlock.benchmarks.gpu_bench", "--out", str(out / "gpu-bench.json"),
                          "--steps", "30", *quick], out, 80),
        run("gpu-engine", [py, "-m", "interlock.benchmarks.gpu_engine",
                           "--out", str(out / f"gpu-engine-{today}.json"), *quick], out, 140),
        run("mask-bench", [py, "-m", "interlock.benchmarks.mask_bench", "--steps", "3", "--schemas", "4",
                           "--data", str(ROOT / "tests" / "data" / "jsonschemabench"),
                           "--out", str(out / "mask-bench.json")], out, 60),
    ]
    summary = "\n".join(f"{name}: exit {code}, {took:.0f} s" for name, code, took in parts)
    (out / "summary.txt").write_text(summary + "\n")
    print(summary)
    sys.exit(max(code for _, code, _ in parts) and 1)


if __name__ == "__main__":
    main()
