"""A library is silent until the application asks: an engine in a program that never configured
logging writes nothing to stdout or stderr, and one that did gets interlock's events."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Requests that log on every path: a constrained one (steps, finish), a grammar that fails to compile (info), a
# cancel (release), with speculation. The program prints nothing itself.
PROGRAM = """
import logging, sys
import anyio
SETUP
from interlock.engine import Engine, EngineConfig
from interlock.models.loader import load_model
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

async def main():
    config = EngineConfig(speculative=SpeculativeConfig(("ngram", "forced"), max_draft_len=3), max_batch_size=2)
    async with Engine(load_model("tiny"), config) as engine:
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
        await engine.complete("JSON please", grammar=JsonSchema(schema), sampling=SamplingParams(max_tokens=16))
        try:
            await engine.complete("x", grammar=JsonSchema({"type": "string", "not": {"const": "a"}}),
                                  sampling=SamplingParams(max_tokens=4))
        except GrammarError:
            pass
        async for _ in engine.generate("Once upon a time", sampling=SamplingParams(max_tokens=30)):
            break

anyio.run(main)
"""


def _run(setup: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", PROGRAM.replace("SETUP", setup)], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).parent, timeout=300)


def test_an_unconfigured_engine_writes_nothing() -> None:
    done = _run("")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""


@pytest.mark.parametrize("setup", [
    "logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)",
    "from interlock.logs import configure_logging; configure_logging(level='debug')",
])
def test_a_program_that_asks_gets_the_events(setup: str) -> None:
    """The positive control: the same program, with logging switched on, logs each step on stderr."""
    done = _run(setup)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "step_planned" in done.stderr and "request_finished" in done.stderr
    assert "request_failed" in done.stderr
