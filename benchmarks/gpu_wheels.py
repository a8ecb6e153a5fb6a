"""Prepare what a bare GPU machine lacks for `make gpu-check`, on a machine that reaches PyPI.

    python -m interlock.benchmarks.gpu_wheels [--dest .whl]     (or: make gpu-wheels)

The GPU machine has Python 3.12, torch (CUDA), triton, transformers, pytest and numpy, and no
network. This downloads cp312 manylinux wheels of the rest, at the versions this environment runs
(so both sides compute with the same libraries), and exports the embedded model's tokenizer as an
HF tokenizer directory (the 100 MB GGUF it lives in is too big to carry): `make gpu-check` installs
the wheels into /tmp/site and points $INTERLOCK_EMBEDDED_TOKENIZER at the directory.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
from pathlib import Path

# What the engine, its tests and the GPU benchmarks import beyond the GPU machine's own packages.
WHEELS = ["xgrammar", "apache-tvm-ffi", "llguidance", "structlog", "gguf", "jsonschema", "referencing", "rpds-py",
          "jsonschema-specifications", "attrs", "pydantic", "pydantic-core", "annotated-types",
          "typing-inspection", "pytest-asyncio", "anyio", "sniffio", "typing-extensions"]
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_34_x86_64"]       # llguidance's is manylinux_2_31
TOKENIZER_DIR = "smollm2-tokenizer"


def download(name: str, dest: Path) -> None:
    version = importlib.metadata.version(name)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(dest),
                    f"{name}=={version}"], check=True)


def export_tokenizer(dest: Path) -> None:
    from interlock.models.loader import embedded_tokenizer

    embedded_tokenizer().hf.save_pretrained(str(dest / TOKENIZER_DIR))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", default=".whl", help="folder for the wheels (carried to the GPU machine)")
    args = parser.parse_args(argv)
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name in WHEELS:
        download(name, dest)
    export_tokenizer(dest)
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"{dest}: {len(list(dest.glob('*.whl')))} wheels and the tokenizer, {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
