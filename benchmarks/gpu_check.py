"""Everything a GPU machine should check, diagnosed in one run of at most 8 minutes.

    make gpu-check                              (OUT=dir; installs .whl/ first, see gpu_wheels.py)
    python -m interlock.benchmarks.gpu_check --out DIR [--budget-s 470]

Every file lands in --out ($OUT). In order, each part with its own time limit, all within one
budget (a part that no longer fits is skipped and says so):
1. preflight.txt: versions, the imports of the engine and the benchmarks, the tokenizer, a CUDA op
   and a Triton kernel, each with its full traceback (benchmarks/gpu_preflight.py);
2. junit/*.xml + tests/*.log: one pytest process per CUDA test file, a few at a time (a device
   assert poisons only its own process), each with a faulthandler timeout shorter than its limit so
   a hang dumps every thread's stack before the process is killed. The engine files run their
   CUDA cases only (`-k cuda`: their CPU cases, on the slow CUDA-rules timeline, would eat the
   part's limit before the CUDA ones ran, leaving no junit XML; CI runs those), and every engine
   there gets a step timeout of STEP_TIMEOUT_S (tests/engine/conftest.py reads
   INTERLOCK_TEST_STEP_TIMEOUT_S), shorter than any part's limit: a hung step becomes a typed
   StepOverdueError in the junit XML, not a kill;
3. smoke.json, host-trace.json, smoke.log: the engine end to end under a debug log and the step
   watchdog (benchmarks/gpu_smoke.py);
4. the GPU benchmarks with --quick, each saving partial JSON as it goes: gpu-bench.json,
   gpu-engine-DATE.json, mask-bench.json.
summary.txt: each part's exit status and time, and, from the junit XML, the counts and every
failed test by name with the first line of its error.
"""
from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent          # the repository (the interlock package)
# (file, limit in seconds): every test file with a CUDA case (tests/benchmarks/test_gpu_check.py checks the list)
CUDA_TESTS = [("tests/streams/test_cuda_timeline.py", 60), ("tests/kernels/test_bitmask_cuda.py", 60),
              ("tests/kernels/test_bitmask_vocab_sizes.py", 60), ("tests/kernels/test_rejection_cuda.py", 60),
              ("tests/kernels/test_rejection_stats.py", 90), ("tests/kernels/test_logprobs.py", 60),
              ("tests/models/test_device_forward.py", 60), ("tests/engine/test_device_runner.py", 150),
              ("tests/engine/test_device_draft.py", 120), ("tests/engine/test_device_features.py", 120),
              ("tests/engine/test_watchdog_cuda.py", 60)]
TEST_WORKERS = 4                                        # pytest processes at once: one GPU, 16 cores
STEP_TIMEOUT_S = 30                                     # an engine step in a test part: well under every limit
CUDA_ONLY = "tests/engine/"                             # files whose CPU cases CI runs: `-k cuda` here
BUDGET_S = 470                                          # 8 minutes, less the install and the report


@dataclass
class Part:
    name: str
    argv: list[str]
    limit_s: int
    log: str
    code: int | None = None        # None: skipped (out of budget)
    took: float = 0.0


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "INTERLOCK_NATIVE_KERNELS": "0",
            "INTERLOCK_TEST_STEP_TIMEOUT_S": str(STEP_TIMEOUT_S)}


def run(parts: list[Part], out: Path, deadline: float, workers: int = 1) -> None:
    """Run `parts`, `workers` at a time, each killed past its limit or the deadline."""
    pending, active = list(parts), []
    while pending or active:
        while pending and len(active) < workers:
            part = pending.pop(0)
            limit = min(part.limit_s, deadline - time.monotonic())
            if limit < 5:
                print(f"== {part.name}: skipped, out of budget", flush=True)
                continue
            print(f"== {part.name}: {' '.join(part.argv)}", flush=True)
            log = open(out / part.log, "w")
            proc = subprocess.Popen(part.argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=_env())
            active.append((part, proc, log, time.monotonic(), limit))
        time.sleep(0.2)
        for item in list(active):
            part, proc, log, start, limit = item
            if proc.poll() is None and time.monotonic() - start < limit:
                continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                part.code = 124
            else:
                part.code = proc.returncode
            log.close()
            part.took = time.monotonic() - start
            active.remove(item)
            print(f"   {part.name}: exit {part.code} in {part.took:.0f} s", flush=True)


def test_parts(out: Path) -> list[Part]:
    py = sys.executable
    (out / "junit").mkdir(exist_ok=True)
    (out / "tests").mkdir(exist_ok=True)
    parts = []
    for path, limit in CUDA_TESTS:
        stem = Path(path).stem
        select = ["-k", "cuda"] if path.startswith(CUDA_ONLY) else []
        parts.append(Part(stem, [py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                                 "-o", f"faulthandler_timeout={max(10, limit - 15)}", *select,
                                 f"--junitxml={out}/junit/{stem}.xml", path], limit, f"tests/{stem}.log"))
    return parts


def other_parts(out: Path, today: str) -> tuple[Part, list[Part]]:
    py = sys.executable
    preflight = Part("preflight", [py, "-m", "interlock.benchmarks.gpu_preflight", "--out", str(out / "preflight.txt")],
                     45, "preflight.log")
    later = [
        Part("smoke", [py, "-m", "interlock.benchmarks.gpu_smoke", "--out", str(out)], 90, "smoke.log"),
        Part("gpu-bench", [py, "-m", "interlock.benchmarks.gpu_bench", "--out", str(out / "gpu-bench.json"),
                           "--steps", "30", "--quick"], 60, "gpu-bench.log"),
        Part("gpu-engine", [py, "-m", "interlock.benchmarks.gpu_engine", "--out", str(out / f"gpu-engine-{today}.json"),
                            "--quick"], 100, "gpu-engine.log"),
        Part("mask-bench", [py, "-m", "interlock.benchmarks.mask_bench", "--steps", "3", "--schemas", "4", "--data",
                            str(ROOT / "tests" / "data" / "jsonschemabench"), "--out", str(out / "mask-bench.json")],
             40, "mask-bench.log"),
    ]
    return preflight, later


def junit_report(folder: Path) -> list[str]:
    """Totals over every junit file, then each failed or errored test with its error's first line."""
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed: list[str] = []
    for xml in sorted(folder.glob("*.xml")):
        try:
            root = ET.parse(xml).getroot()
        except ET.ParseError as exc:
            failed.append(f"{xml.name}: unreadable junit XML ({exc})")
            continue
        for suite in root.iter("testsuite"):
            for key in totals:
                totals[key] += int(suite.get(key, 0))
        for case in root.iter("testcase"):
            for bad in [*case.findall("failure"), *case.findall("error")]:
                first = (bad.get("message") or bad.text or "").strip().splitlines()
                failed.append(f"FAILED {case.get('classname')}::{case.get('name')}: {first[0] if first else ''}")
    line = ", ".join(f"{v} {k}" for k, v in totals.items())
    return [f"tests: {line}", *failed]


def summarize(out: Path, parts: list[Part]) -> str:
    lines = []
    for p in parts:
        status = "skipped (out of budget)" if p.code is None else \
            f"exit {p.code}{' (killed at its limit)' if p.code == 124 else ''}, {p.took:.0f} s"
        lines.append(f"{p.name}: {status}  [{p.log}]")
    lines += junit_report(out / "junit")
    missing = [p.name for p in parts if p.log.startswith("tests/") and not (out / "junit" / f"{p.name}.xml").exists()]
    if missing:
        lines.append("no junit XML (killed or crashed: see tests/NAME.log for faulthandler's stacks): "
                     + ", ".join(missing))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-check-out"))
    parser.add_argument("--budget-s", type=float, default=BUDGET_S)
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    preflight, later = other_parts(out, datetime.date.today().isoformat())
    tests = test_parts(out)
    run([preflight], out, deadline)
    run(tests, out, deadline, workers=TEST_WORKERS)
    run(later, out, deadline)
    parts = [preflight, *tests, *later]
    summary = summarize(out, parts)
    (out / "summary.txt").write_text(summary)
    print(summary, flush=True)
    sys.exit(0 if all(p.code == 0 for p in parts) else 1)


if __name__ == "__main__":
    main()
