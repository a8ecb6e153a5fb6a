"""The engine end to end on a GPU, with what it takes to diagnose it: the part of gpu-check that
says whether the device runner works, and if not, where.

    python -m interlock.benchmarks.gpu_smoke --out DIR [--device cuda]    (make gpu-check runs it)

On the tiny preset (random weights, the embedded tokenizer), under a debug log (JSON lines on
stderr) and a 60 s step watchdog, so a fault or a hang ends in a typed error, not a killed process:
- greedy JSON, captured and eager: the same tokens, and the finished outputs validate;
- seeded sampling with top-k and top-p, captured and eager: the same tokens;
- every feature at once, captured and eager: a self-draft of 1 layer with draft masks (rounds in
  the step), classifier-free guidance, penalties and logprobs on seeded requests under a grammar;
- the engine's metrics (captured programs, replayed and eager steps) and the peak GPU memory;
- a host-function trace of ~30 decode steps at batch 8: each host function's name, lane, thread,
  start and end (DIR/host-trace.json), and per name its count and mean time.
DIR/smoke.json is rewritten after each part, so a crash leaves what ran before it. `--device cpu`
runs the same on the CPU-side device runner (the CUDA-rules timeline; tests/benchmarks run it).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import anyio
import jsonschema
import torch

from interlock.benchmarks.gpu_bench import SCHEMA
from interlock.benchmarks.gpu_engine import random_model
from interlock.engine import Engine, EngineConfig
from interlock.logs import configure_logging
from interlock.models.loader import LoadedModel
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

PROMPTS = [f"Record {i}: the quick brown fox jumps over the lazy dog. Give it as JSON." for i in range(8)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=40)
SAMPLED = [SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=i, max_tokens=24) for i in range(8)]


def config(device: str, capture: bool, mode: str = "ngram+forced", **kw: object) -> EngineConfig:
    return EngineConfig(speculative=SpeculativeConfig.parse(mode, max_draft_len=3), device=device,
                        runner="device", max_batch_size=8, max_context=512, capture_steps=capture,
                        step_timeout_s=60.0, prefix_caching=False, **kw)  # type: ignore[arg-type]


async def complete_all(engine: Engine, grammar: object, samplings: list[SamplingParams]) -> list:
    outs: list = [None] * len(samplings)

    async def one(i: int) -> None:
        outs[i] = await engine.complete(PROMPTS[i], grammar=grammar, sampling=samplings[i])

    async with anyio.create_task_group() as tg:
        for i in range(len(samplings)):
            tg.start_soon(one, i)
    return outs


# one request per feature (and one with none), sampled with seeds, under the JSON grammar
FEATURES = [SamplingParams(temperature=0.7, seed=i, max_tokens=24, **kw) for i, kw in enumerate([
    {}, {"guidance_scale": 1.5}, {"repetition_penalty": 1.2, "frequency_penalty": 0.3}, {"logprobs": 3}])]


async def captured_vs_eager(loaded: LoadedModel, device: str, grammar: object, samplings: list[SamplingParams],
                            mode: str = "ngram+forced") -> dict[str, object]:
    runs, metrics = {}, {}
    for capture in (True, False):
        async with Engine(loaded, config(device, capture, mode)) as engine:
            runs[capture] = await complete_all(engine, grammar, samplings)
            metrics[capture] = dataclasses.asdict(await engine.metrics())
    same = [a.token_ids == b.token_ids for a, b in zip(runs[True], runs[False])]
    valid = []
    for c in runs[True]:
        if grammar is not None and c.finish_reason == "stop":
            jsonschema.validate(json.loads(c.text), SCHEMA)
            valid.append(True)
    return {"captured_equals_eager": all(same), "per_request": same, "validated_json": len(valid),
            "finish": [c.finish_reason for c in runs[True]], "token_ids": [list(c.token_ids) for c in runs[True]],
            "metrics_captured": metrics[True], "metrics_eager": metrics[False]}


async def host_trace(loaded: LoadedModel, device: str) -> tuple[dict[str, object], list[dict[str, object]]]:
    """~30 decode steps at batch 8 (one token a step), under a JSON grammar, every host function traced."""
    async with Engine(loaded, config(device, True, "none", trace_host_functions=True)) as engine:
        await complete_all(engine, JsonSchema(SCHEMA), [GREEDY] * 8)            # warm-up: compile, capture
        # A step's tokens go out inside its tail host function, whose trace entry is written when it
        # returns: the window is the calls started after the warm-up, read once every step's tail is in.
        t0 = time.perf_counter()
        before = await engine.metrics()
        await complete_all(engine, JsonSchema(SCHEMA), [SamplingParams(temperature=0.0, max_tokens=30)] * 8)
        steps = (await engine.metrics()).steps - before.steps
        with anyio.fail_after(30):
            while sum(c.start >= t0 and c.name == "StepProgram._tail" for c in engine.host_trace()) < steps:
                await anyio.sleep(0.01)
        calls = [c for c in engine.host_trace() if c.start >= t0]
    by_name: dict[str, list[float]] = defaultdict(list)
    for c in calls:
        by_name[c.name].append(1e3 * (c.end - c.start))
    summary = {"steps": steps, "host_functions": len(calls), "per_step": len(calls) / max(steps, 1),
               "threads": sorted({c.thread for c in calls}),
               "by_name": {n: {"count": len(v), "mean_ms": statistics.fmean(v), "max_ms": max(v)}
                           for n, v in sorted(by_name.items())}}
    rows = [{"name": c.name, "lane": c.lane, "thread": c.thread, "start": c.start, "end": c.end} for c in calls]
    return summary, rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for smoke.json and host-trace.json")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    configure_logging(json=True, level="debug")
    results: dict[str, object] = {"device": args.device, "parts": {}}
    save = lambda: (out / "smoke.json").write_text(json.dumps(results, indent=1))  # noqa: E731
    cuda = args.device.startswith("cuda")
    loaded = random_model("tiny", torch.device(args.device))
    parts = [("greedy_json", lambda: captured_vs_eager(loaded, args.device, JsonSchema(SCHEMA), [GREEDY] * 4)),
             ("seeded_top_k_top_p", lambda: captured_vs_eager(loaded, args.device, None, SAMPLED[:4])),
             ("features_self_draft_cfg_penalties_logprobs",
              lambda: captured_vs_eager(loaded, args.device, JsonSchema(SCHEMA), FEATURES, "self-draft+forced")),
             ("host_trace", lambda: host_trace(loaded, args.device))]
    failed = False
    for name, part in parts:
        start = time.perf_counter()
        try:
            value = anyio.run(part)
            if name == "host_trace":
                value, rows = value
                (out / "host-trace.json").write_text(json.dumps(rows))
            results["parts"][name] = {"ok": value.get("captured_equals_eager", True), **value}  # type: ignore[index]
            failed |= not results["parts"][name]["ok"]  # type: ignore[index]
        except Exception as exc:  # noqa: BLE001 - record it, run the other parts
            results["parts"][name] = {"ok": False, "error": repr(exc)}  # type: ignore[index]
            failed = True
        results["parts"][name]["seconds"] = time.perf_counter() - start  # type: ignore[index]
        if cuda:
            results["peak_gpu_memory_mib"] = torch.cuda.max_memory_allocated() / 2**20
        save()
        print(json.dumps({name: {k: v for k, v in results["parts"][name].items()  # type: ignore[index]
                                 if k not in ("token_ids", "metrics_eager")}}), file=sys.stdout, flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
