"""Tensor parallelism starts from any main program: a script with or without a `__main__` guard,
`python -` (the program on stdin) and `python -c`. Each runs a real Python process that starts an
engine with tensor_parallel=2 (the tiny preset) and generates a few tokens; all four must agree.

The ranks are `python -m interlock.parallel.worker` processes (parallel/process.py), so nothing
re-runs the main program: with multiprocessing's spawn, `python -` died (no file to re-run) and a
script without the guard started its engine again in every rank.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from interlock.parallel.process import child_env

BODY = """\
import anyio
from interlock import Engine, SamplingParams

async def main():
    engine = Engine.from_pretrained("tiny", speculative=None, tensor_parallel=2, max_batch_size=1)
    async with engine:
        out = await engine.complete("The list of", sampling=SamplingParams(max_tokens=6))
        print("TOKENS", *out.token_ids)
"""
GUARDED = BODY + '\nif __name__ == "__main__":\n    anyio.run(main)\n'
UNGUARDED = BODY + "\nanyio.run(main)\n"
MODES = ["script with a guard", "script without a guard", "python -", "python -c"]


def run(mode: str, folder: Path) -> subprocess.CompletedProcess[str]:
    stdin = None
    if mode.startswith("script"):
        script = folder / "main_program.py"
        script.write_text(GUARDED if "with a guard" in mode else UNGUARDED)
        argv = [sys.executable, str(script)]
    elif mode == "python -":
        argv, stdin = [sys.executable, "-"], UNGUARDED
    else:
        argv = [sys.executable, "-c", UNGUARDED]
    # the environment the ranks get, so that this process imports the interlock under test
    return subprocess.run(argv, input=stdin, cwd=folder, env=child_env(), capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    return {mode: run(mode, tmp_path_factory.mktemp("main")) for mode in MODES}


@pytest.mark.parametrize("mode", MODES)
def test_tensor_parallel_starts_from_this_main_program(outputs: dict[str, subprocess.CompletedProcess[str]],
                                                       mode: str) -> None:
    done = outputs[mode]
    assert done.returncode == 0, f"{mode}: exit {done.returncode}\n{done.stderr[-3000:]}"
    lines = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("TOKENS")]
    assert len(lines) == 1 and len(lines[0]) == 6, done.stdout       # the engine ran once, not once per rank


def test_every_main_program_generates_the_same_tokens(outputs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    tokens = {mode: [line for line in done.stdout.splitlines() if line.startswith("TOKENS")]
              for mode, done in outputs.items()}
    assert len({tuple(t) for t in tokens.values()}) == 1, tokens
