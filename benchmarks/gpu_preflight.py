"""gpu-check's first part: what the machine has, and whether everything imports, with full tracebacks.

    python -m interlock.benchmarks.gpu_preflight [--out FILE]

Each check runs on its own and prints `ok` or its whole traceback, so one missing wheel or a
broken import names itself before any test or benchmark runs: versions (Python, torch and its
CUDA, triton, transformers, xgrammar, llguidance, the GPU and driver, the cores), the imports of
the engine, the CUDA timeline, the Triton ops and every benchmark, the embedded tokenizer, a CUDA
tensor op and a Triton kernel. Exit status 1 if any check failed.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import platform
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

MODULES = ["interlock", "interlock.engine", "interlock.streams.cuda_timeline", "interlock.streams.hostfunc",
           "interlock.models.triton_ops", "interlock.kernels.bitmask_triton", "interlock.kernels.rejection_triton",
           "interlock.benchmarks.gpu_bench", "interlock.benchmarks.gpu_engine", "interlock.benchmarks.gpu_smoke",
           "interlock.benchmarks.mask_bench"]
PACKAGES = ["torch", "triton", "transformers", "tokenizers", "xgrammar", "llguidance", "numpy", "pytest", "anyio",
            "structlog", "jsonschema", "pydantic", "hypothesis", "rich", "typing-extensions"]
# what the carried wheels need of what the machine has: pytest-asyncio needs pytest >= 8.4; anyio 4.16
# and pydantic 2.14 need typing-extensions >= 4.16 (gpu_wheels.py carries it; an older one shadows it)
MINIMUM = {"pytest": (8, 4), "typing-extensions": (4, 16)}


def versions() -> str:
    lines = [f"python {platform.python_version()} on {platform.platform()}, {os.cpu_count()} cpus"]
    for name in PACKAGES:
        try:
            lines.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            lines.append(f"{name} MISSING")
    import torch

    lines.append(f"torch cuda {torch.version.cuda}, available {torch.cuda.is_available()}")
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        lines.append(f"gpu {smi.stdout.strip() or smi.stderr.strip()}")
    except OSError as exc:
        lines.append(f"nvidia-smi: {exc}")
    return "\n".join(lines)


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def minimum_versions(version_of: Callable[[str], str] = importlib.metadata.version) -> str:
    """Each package in MINIMUM at or past its minimum; RuntimeError naming every one that is not."""
    found, bad = [], []
    for name, least in MINIMUM.items():
        try:
            have = version_of(name)
        except importlib.metadata.PackageNotFoundError:
            bad.append(f"{name} missing (needs >= {'.'.join(map(str, least))})")
            continue
        (found if _release(have) >= least else bad).append(f"{name} {have} (needs >= {'.'.join(map(str, least))})")
    if bad:
        raise RuntimeError("too old for the carried wheels: " + "; ".join(bad))
    return ", ".join(found)


def imports() -> str:
    for name in MODULES:
        importlib.import_module(name)
    return f"{len(MODULES)} modules"


def tokenizer() -> str:
    from interlock.models.loader import embedded_tokenizer

    tok = embedded_tokenizer()
    return f"embedded tokenizer: {tok.vocab_size} ids, eos {tok.eos_token_ids}"


def cuda_op() -> str:
    import torch

    x = torch.arange(1024, device="cuda", dtype=torch.float32)
    value = float((x * 2).sum())
    assert value == 1023 * 1024, value
    return f"{torch.cuda.get_device_name()}: a kernel ran"


def triton_kernel() -> str:
    import torch

    from interlock.models import reference_ops, triton_ops

    x = torch.randn(4, 256, device="cuda")
    w = torch.randn(256, device="cuda")
    err = float((triton_ops.rms_norm(x, w, 1e-5) - reference_ops.rms_norm(x, w, 1e-5)).abs().max())
    assert err < 1e-4, err
    return f"triton rms_norm matches the reference (max err {err:.1e})"


CHECKS: list[tuple[str, Callable[[], str]]] = [("versions", versions), ("minimum versions", minimum_versions),
                                               ("imports", imports),
                                               ("tokenizer", tokenizer), ("cuda", cuda_op), ("triton", triton_kernel)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also write the report here")
    args = parser.parse_args(argv)
    report, failed = [], 0
    for name, check in CHECKS:
        try:
            report.append(f"== {name}: ok\n{check()}")
        except BaseException:  # noqa: BLE001 - the point is to report every failure in full
            failed += 1
            report.append(f"== {name}: FAILED\n{traceback.format_exc()}")
        print(report[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(report) + "\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
