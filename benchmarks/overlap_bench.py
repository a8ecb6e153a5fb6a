"""Which of a device-runner step's host work runs with the device idle, on the CPU timeline.

    python -m interlock.benchmarks.overlap_bench [--model tiny] [--batch 8] [--tokens 32]
        [--speculative ngram+forced,none] [--schedules tail,split] [--switch-ms 5] [--repeats 1] [--out FILE]

The device runner runs on the CPU under CUDA's rules (streams/cuda_rules.py): its device work runs
on the model lane's thread, and with `trace=True` the timeline keeps when each launch's work ran
(`device_trace()`) and when each host function ran (`host_trace()`). This script runs `--batch`
greedy JSON-schema requests at once (K=3 where the drafters draft) through that engine, once to warm
up (the buckets' captures) and once measured, and times, on the same clock, the step's host work:

- on the loop, the prologue (`StepProgram._prologue`) and in it the grammar's draft check
  (`GrammarActor.check`);
- host functions: the mask fill (`GrammarActor.fill`) and in it the last step's commits left to it
  (`GrammarActor._settle`: "settle"), the tail (`StepProgram._tail`) and in it the results
  (`verifier.finish`), the drafters' commit (`draft.commit`) and the grammar's (`GrammarActor.commit`).

Each interval's *exposed* part is what of it overlaps no device work of the model lane: host work
the device waited out (on a GPU, GPU idle). Per step, in ms: each part's mean time and mean exposed
time, the engine's own exposed-grammar metric (the model lane's wait for the grammar lane), and
`fill_start`: from the step's enqueue to its fill's start (the grammar lane's first op: the host
thread's wake-up and its wait for the GIL, which `sys.setswitchinterval` bounds; `--switch-ms`
runs each configuration at each interval given).

One invocation runs every combination of `--speculative` (drafters; "none": plain decoding),
`--schedules` ("tail": every matcher commit in the tail, the schedule before the split; "split":
the engine's, `GrammarActor.defer_commits`) and `--switch-ms`, `--repeats` times interleaved, so
that a loaded machine's drift falls on all of them alike.
"""
from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
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
SCHEDULES = ("tail", "split")


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


def fill_starts(launches: list[float], fills: list[Interval]) -> list[float]:
    """Per step, from its enqueue to its fill's start: each fill paired with the last launch before it."""
    out, i = [], -1
    for start, _ in sorted(fills):
        while i + 1 < len(launches) and launches[i + 1] <= start:
            i += 1
        if i >= 0:
            out.append(start - launches[i])
    return out


async def run(loaded: object, batch: int, tokens: int, speculative: str, schedule: str) -> dict[str, object]:
    """One engine: a warm-up round, then one measured round of `batch` requests at once."""
    spec = SpeculativeConfig.parse(speculative, max_draft_len=3)
    config = EngineConfig(speculative=spec, runner="device", device="cpu", max_batch_size=batch,
                          trace_host_functions=True)
    sampling = SamplingParams(temperature=0.0, max_tokens=tokens)
    spans: dict[str, list[Interval]] = {n: [] for n in ("prologue", "check", "settle", "finish", "draft_commit",
                                                         "commit")}
    launches: list[float] = []
    async with Engine(loaded, config) as engine:                # type: ignore[arg-type]
        program = engine._rt.program                       # the parts are instrumented before any step
        grammar = program.grammar
        grammar.defer_commits = schedule == "split"         # type: ignore[attr-defined]
        program._prologue = timed(spans["prologue"], program._prologue)
        grammar.check = timed(spans["check"], grammar.check)
        grammar._settle = timed(spans["settle"], grammar._settle)     # type: ignore[attr-defined]
        grammar.commit = timed(spans["commit"], grammar.commit)
        program.draft.commit = timed(spans["draft_commit"], program.draft.commit)
        program.verifier.finish = timed(spans["finish"], program.verifier.finish)
        enqueue = program._enqueue_step

        def enqueue_step(shape: object) -> None:
            launches.append(time.perf_counter())
            enqueue(shape)
        program._enqueue_step = enqueue_step                # type: ignore[method-assign]

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
        launches.clear()
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
    waits = fill_starts(launches, spans["fill"])
    return {"speculative": speculative, "schedule": schedule, "switch_ms": 1e3 * sys.getswitchinterval(),
            "steps": steps, "step_ms": 1e3 * (after.step_s - before.step_s) / steps,
            "device_busy_ms_per_step": 1e3 * sum(b - a for a, b in busy) / steps,
            "exposed_grammar_metric_ms_per_step": 1e3 * (after.exposed_grammar_s - before.exposed_grammar_s) / steps,
            "replayed_steps": after.replayed_steps - before.replayed_steps, "parts": parts,
            "fill_start_ms": {"mean": 1e3 * sum(waits) / max(1, len(waits)), "max": 1e3 * max(waits, default=0.0)}}


async def run_all(model: str, batch: int, tokens: int, speculative: list[str], schedules: list[str],
                  switch_ms: list[float], repeats: int) -> list[dict[str, object]]:
    loaded = load_model(model, weights="float")
    default = sys.getswitchinterval()
    runs = []
    try:
        for _ in range(repeats):
            for spec, schedule, ms in itertools.product(speculative, schedules, switch_ms):
                sys.setswitchinterval(ms / 1e3)
                runs.append(await run(loaded, batch, tokens, spec, schedule))
    finally:
        sys.setswitchinterval(default)
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--speculative", default="ngram+forced", help="comma-separated drafter sets ('none': plain)")
    p.add_argument("--schedules", default="split", help=f"comma-separated, of {', '.join(SCHEDULES)}")
    p.add_argument("--switch-ms", default="5", help="comma-separated sys.setswitchinterval values, ms")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--label", default="", help="what this run is, kept in the JSON")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    schedules = args.schedules.split(",")
    if not set(schedules) <= set(SCHEDULES):
        p.error(f"--schedules takes {', '.join(SCHEDULES)}")
    runs = anyio.run(run_all, args.model, args.batch, args.tokens, args.speculative.split(","), schedules,
                     [float(x) for x in args.switch_ms.split(",")], args.repeats)
    for r in runs:
        rows = [(name, f"{v['ms_per_step']:.3f}", f"{v['exposed_ms_per_step']:.3f}", v["calls"])
                for name, v in r["parts"].items()]  # type: ignore[union-attr]
        print_table(f"{r['speculative']}, {r['schedule']} schedule, switch interval {r['switch_ms']:g} ms: "
                    f"{r['steps']} steps, {r['step_ms']:.1f} ms/step, fill start "
                    f"{r['fill_start_ms']['mean']:.3f} ms (max {r['fill_start_ms']['max']:.3f}), "  # type: ignore[index]
                    f"exposed-grammar metric {r['exposed_grammar_metric_ms_per_step']:.3f} ms/step",
                    ["part", "ms/step", "exposed ms/step", "calls"], rows)
    result = {"model": args.model, "batch": args.batch, "max_tokens": args.tokens, "label": args.label,
              "cpu": _cpu_name() or platform.processor() or platform.machine(), "runs": runs}
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
