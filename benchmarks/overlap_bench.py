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
`fill_start` / `masks_ready`: from the step's enqueue to its fill's start / end (the fill is the
grammar lane's first op; its start waits for the host thread, which may still be finishing the last
step's tail, and for the GIL, which the loop holds while it delivers and plans; a thread waiting for
the GIL gets it within `sys.setswitchinterval`, and `--switch-ms` runs each configuration at each
interval given). On a GPU the masks are hidden when they are ready before the forward ends.
`loop_hold`: from the step's enqueue to the loop's next selector call, where it releases the GIL:
how long the event loop's Python (the rest of the launch, the last step's delivery) can hold the
GIL the fill's host function needs, on a GPU too. Its wall time here also counts the loop's own
waits for the GIL (the CPU timeline's model lane runs device work's Python on a thread; a GPU has
none) and for a core; `loop_hold_cpu` counts the loop thread's CPU time alone (`time.thread_time`):
the Python it runs before it lets go, which a GPU run has too.

One invocation runs every combination of `--speculative` (drafters; "none": plain decoding),
`--schedules` ("tail": every matcher commit in the tail, the schedule before the split; "split":
the engine's, `GrammarActor.defer_commits`) and `--switch-ms`, `--repeats` times interleaved, so
that a loaded machine's drift falls on all of them alike.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import anyio

from interlock.benchmarks.common import cpu_name, median, print_json_last, print_table
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


def since_launch(launches: list[float], fills: list[Interval]) -> list[Interval]:
    """Per fill, (start, end) from its step's enqueue: the last of the sorted `launches` before it starts."""
    out, i = [], -1
    for start, end in sorted(fills):
        while i + 1 < len(launches) and launches[i + 1] <= start:
            i += 1
        if i >= 0:
            out.append((start - launches[i], end - launches[i]))
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
            launch_cpu.append(time.thread_time())           # the loop thread's own CPU time
            enqueue(shape)
        program._enqueue_step = enqueue_step                # type: ignore[method-assign]
        selects: list[float] = []
        select_cpu: list[float] = []
        launch_cpu: list[float] = []
        selector = asyncio.get_running_loop()._selector      # type: ignore[attr-defined]
        select = selector.select

        def timed_select(timeout: float | None = None) -> object:
            selects.append(time.perf_counter())             # the loop lets go of the GIL here
            select_cpu.append(time.thread_time())
            return select(timeout)
        selector.select = timed_select

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
        for marks in (launches, launch_cpu, selects, select_cpu):
            marks.clear()
        await one_round()
        end = time.perf_counter()
        after = await engine.metrics()
        timeline = engine._rt.timeline
        selector.select = select
        hosts = [c for c in timeline.host_trace() if start <= c.start <= end]
        busy = union([(c.start, c.end) for c in timeline.device_trace() if c.lane == "model" and c.end >= start])
    for name, qualname in (("fill", "GrammarActor.fill"), ("tail", "StepProgram._tail")):
        spans[name] = [(c.start, c.end) for c in hosts if c.name == qualname]
    steps = after.steps - before.steps
    parts = {name: {"ms_per_step": 1e3 * sum(b - a for a, b in s) / steps,
                    "exposed_ms_per_step": 1e3 * sum(exposed_s(x, busy) for x in s) / steps, "calls": len(s)}
             for name, s in spans.items()}
    waits = since_launch(launches, spans["fill"])
    starts, ends = [a for a, _ in waits], [b for _, b in waits]
    return {"speculative": speculative, "schedule": schedule, "switch_ms": 1e3 * sys.getswitchinterval(),
            "steps": steps, "step_ms": 1e3 * (after.step_s - before.step_s) / steps,
            "device_busy_ms_per_step": 1e3 * sum(b - a for a, b in busy) / steps,
            "exposed_grammar_metric_ms_per_step": 1e3 * (after.exposed_grammar_s - before.exposed_grammar_s) / steps,
            "replayed_steps": after.replayed_steps - before.replayed_steps, "parts": parts,
            "fill_start_ms": _mean_max(starts), "masks_ready_ms": _mean_max(ends),
            "loop_hold_ms": _mean_max(next_after(launches, selects)),
            "loop_hold_cpu_ms": _mean_max(next_after(launch_cpu, select_cpu))}


def next_after(launches: list[float], marks: list[float]) -> list[float]:
    """Per launch, the time to the first of the sorted `marks` at or after it (none past the last mark)."""
    out, i = [], 0
    for t in sorted(launches):
        while i < len(marks) and marks[i] < t:
            i += 1
        if i < len(marks):
            out.append(marks[i] - t)
    return out


def _mean_max(values: list[float]) -> dict[str, float]:
    """Mean, median and max, in ms, of values in s."""
    return {"mean": 1e3 * sum(values) / max(1, len(values)), "p50": 1e3 * median(values),
            "max": 1e3 * max(values, default=0.0)}


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
        print_table(f"{_name(r)}: {r['steps']} steps, {r['step_ms']:.1f} ms/step, exposed-grammar metric "
                    f"{r['exposed_grammar_metric_ms_per_step']:.3f} ms/step",
                    ["part", "ms/step", "exposed ms/step", "calls"], rows)
    clocks = ("fill_start_ms", "masks_ready_ms", "loop_hold_ms", "loop_hold_cpu_ms")
    print_table("from each step's enqueue, ms (median / max)", ["run", *clocks],
                [(_name(r), *(f"{r[c]['p50']:.3f} / {r[c]['max']:.3f}" for c in clocks)) for r in runs])  # type: ignore[index]
    result = {"model": args.model, "batch": args.batch, "max_tokens": args.tokens, "label": args.label,
              "cpu": cpu_name(), "runs": runs}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print_json_last(result)


def _name(r: dict[str, object]) -> str:
    return f"{r['speculative']}, {r['schedule']}, switch {r['switch_ms']:g} ms"


if __name__ == "__main__":
    main()
