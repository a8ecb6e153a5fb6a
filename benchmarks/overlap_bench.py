"""Which of a device-runner step's host work runs with the device idle, on the CPU timeline.

    python -m interlock.benchmarks.overlap_bench [--model tiny] [--batch 8] [--tokens 32] [--out FILE]

The device runner runs on the CPU under CUDA's rules (streams/cuda_rules.py): its device work runs
on the model lane's thread, and with `trace=True` the timeline keeps when each launch's work ran
(`device_trace()`) and when each host function ran (`host_trace()`). This script runs `--batch`
greedy JSON-schema requests at once (n-gram + forced drafts, K=3) through that engine, once to warm
up (the buckets' captures) and once measured, and times, on the same clock, the step's host work:

- on the loop, the prologue (`StepProgram._prologue`) and in it the grammar's draft check
  (`GrammarActor.check`);
- host functions: the mask fill (`GrammarActor.fill`), the tail (`StepProgram._tail`) and in it
  the grammar's commit (`GrammarActor.commit`).

Each interval's *exposed* part is what of it overlaps no device work of the model lane: host work
the device waited out (on a GPU, GPU idle). Per step, in ms: each part's mean time and mean exposed
time, and the engine's own exposed-grammar metric (the model lane's wait for the grammar lane).
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

import anyio

from interlock.benchmarks.common import print_json_last, print_table
from interlock.engine import Engine, EngineConfig
from interlock.models.loader import load_model
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}},
                                           "age": {"type": "integer"}}, "required": ["name", "tags", "age"]}
Interval = tuple[float, float]


def exposed_s(span: Interval, busy: list[Interval]) -> float:
    """How much of `span` overlaps none of the (sorted, disjoint) `busy` intervals."""
    lo, hi = span
    covered = sum(max(0.0, min(hi, b) - max(lo, a)) for a, b in busy)
    return (hi - lo) - covered


def union(intervals: list[Interval]) -> list[Interval]:
    """The sorted, disjoint union of `intervals`."""
    out: list[Interval] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def timed(spans: list[Interval], fn: Callable[..., object]) -> Callable[..., object]:
    """fn, appending each call's (start, end) to `spans`."""
    def wrapper(*args: object) -> object:
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            spans.append((start, time.perf_counter()))
    wrapper.__qualname__ = getattr(fn, "__qualname__", "timed")     # the trace names host functions by it
    return wrapper


async def run(model: str, batch: int, tokens: int) -> dict[str, object]:
    loaded = load_model(model, weights="float")
    config = EngineConfig(speculative=SpeculativeConfig.parse("ngram+forced", max_draft_len=3), runner="device",
                          device="cpu", max_batch_size=batch, trace_host_functions=True)
    sampling = SamplingParams(temperature=0.0, max_tokens=tokens)
    spans: dict[str, list[Interval]] = {"prologue": [], "check": [], "commit": []}
    async with Engine(loaded, config) as engine:
        program = engine._rt.program                       # the parts are instrumented before any step
        program._prologue = timed(spans["prologue"], program._prologue)
        program.grammar.check = timed(spans["check"], program.grammar.check)
        program.grammar.commit = timed(spans["commit"], program.grammar.commit)

        async def one_round() -> None:
            async with anyio.create_task_group() as tg:
                for i in range(batch):
                    tg.start_soon(lambda i=i: engine.complete(f"Person {i} as JSON:", grammar=JsonSchema(SCHEMA),
                                                              sampling=sampling))

        await one_round()                                   # warm-up: the buckets' first steps and captures
        before = await engine.metrics()
        start = time.perf_counter()
        for s in spans.values():
            s.clear()
        await one_round()
        end = time.perf_counter()
        after = await engine.metrics()
        timeline = engine._rt.timeline
        hosts = [c for c in timeline.host_trace() if start <= c.start <= end]
        busy = union([(c.start, c.end) for c in timeline.device_trace() if c.lane == "model" and c.end >= start])
    for name, qualname in (("fill", "GrammarActor.fill"), ("tail", "StepProgram._tail")):
        spans[name] = [(c.start, c.end) for c in hosts if c.name == qualname]
    steps = after.steps - before.steps
    parts = {name: {"ms_per_step": 1e3 * sum(b - a for a, b in s) / steps,
                    "exposed_ms_per_step": 1e3 * sum(exposed_s(x, busy) for x in s) / steps, "calls": len(s)}
             for name, s in spans.items()}
    return {"model": model, "batch": batch, "max_tokens": tokens, "steps": steps,
            "step_ms": 1e3 * (after.step_s - before.step_s) / steps,
            "device_busy_ms_per_step": 1e3 * sum(b - a for a, b in busy) / steps,
            "exposed_grammar_metric_ms_per_step": 1e3 * (after.exposed_grammar_s - before.exposed_grammar_s) / steps,
            "replayed_steps": after.replayed_steps - before.replayed_steps, "parts": parts,
            "cpu": platform.processor() or platform.machine()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--label", default="", help="what this run is (before / after a change), kept in the JSON")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    result = anyio.run(run, args.model, args.batch, args.tokens)
    result["label"] = args.label
    cpu = _cpu_name()
    if cpu:
        result["cpu"] = cpu
    rows = [(name, f"{v['ms_per_step']:.3f}", f"{v['exposed_ms_per_step']:.3f}", v["calls"])
            for name, v in result["parts"].items()]  # type: ignore[union-attr]
    print_table(f"host work per step, device runner on the CPU timeline ({result['steps']} steps, "
                f"{result['step_ms']:.1f} ms/step, exposed-grammar metric "
                f"{result['exposed_grammar_metric_ms_per_step']:.3f} ms/step)",
                ["part", "ms/step", "exposed ms/step", "calls"], rows)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print_json_last(result)


def _cpu_name() -> str:
    """The CPU's model name (Linux), for the result file."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


if __name__ == "__main__":
    main()
