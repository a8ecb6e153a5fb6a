"""What unconfigured logging cost: the same requests with the library's default (silent, filtered
by one level check) and with every debug event rendered, as an application that never configured
structlog paid before interlock.logs (structlog's default console lines, one per step).

    python -m interlock.benchmarks.log_cost [--model smollm2-135m-instruct] [--requests 4] [--repeats 3]

The two modes alternate, `repeats` times each, on one engine per run and the same greedy requests;
the rendered lines go to os.devnull so the terminal's speed is not what is measured. Prints a table,
then the JSON (tokens/s per run, medians, the ratio, every output's token ids) as its last line,
and saves it under benchmarks/results/ with --save.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import anyio

from interlock.benchmarks.common import load_average, median, print_json_last, print_table

PROMPTS = ["Tell me about the history of Lisbon.", "Write a short story about a robot who learns to paint.",
           "Explain how a bicycle works.", "List ten fruits and what colour they are."]


def _set_mode(mode: str, sink: logging.Handler) -> None:
    import structlog

    root = logging.getLogger("interlock")
    structlog.reset_defaults()                         # structlog's defaults: console lines, debug included
    if mode == "debug-rendered":
        root.addHandler(sink)
        root.setLevel(logging.DEBUG)
    else:
        root.removeHandler(sink)
        root.setLevel(logging.NOTSET)                  # unconfigured: the effective level is WARNING


async def _run_once(engine, prompts: list[str], max_tokens: int) -> tuple[float, list[list[int]]]:
    from interlock.protocol.sampling import SamplingParams

    start = time.perf_counter()
    ids = []
    for p in prompts:
        c = await engine.complete([{"role": "user", "content": p}],
                                  sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        ids.append(list(c.token_ids))
    wall = time.perf_counter() - start
    return sum(len(i) for i in ids) / wall, ids


async def _main(args: argparse.Namespace) -> dict:
    from interlock.engine import Engine
    from interlock.models.loader import load_model

    loaded = load_model(args.model)
    sink = logging.StreamHandler(open(os.devnull, "w"))       # noqa: SIM115 (lives for the run)
    prompts = (PROMPTS * args.requests)[: args.requests]
    runs: dict[str, list[float]] = {"silent": [], "debug-rendered": []}
    outputs: dict[str, list[list[int]]] = {}
    async with Engine(loaded, _config(args)) as engine:
        await _run_once(engine, prompts[:1], 8)                # warm-up
        for _ in range(args.repeats):
            for mode in runs:
                _set_mode(mode, sink)
                tps, ids = await _run_once(engine, prompts, args.max_tokens)
                runs[mode].append(round(tps, 2))
                outputs[mode] = ids
    micro = {}
    for mode in runs:                                          # one step_planned event, per call
        _set_mode(mode, sink)
        micro[mode] = _event_cost_us()
    _set_mode("silent", sink)
    med = {m: median(v) for m, v in runs.items()}
    return {"model": args.model, "speculative": args.speculative, "requests": args.requests,
            "max_tokens": args.max_tokens, "repeats": args.repeats, "tokens_per_s": runs,
            "median_tokens_per_s": med, "silent_over_rendered": round(med["silent"] / med["debug-rendered"], 3),
            "event_cost_us": micro, "same_tokens": outputs["silent"] == outputs["debug-rendered"], "load_average": load_average(),
            "token_ids": outputs["silent"]}


def _event_cost_us(n: int = 20_000) -> float:
    from interlock.logs import get_logger

    log = get_logger("interlock.actors.scheduler")
    start = time.perf_counter()
    for i in range(n):
        log.debug("step_planned", step=i, requests=8, sampling=8, prompt_tokens=0)
    return round((time.perf_counter() - start) / n * 1e6, 3)


def _config(args: argparse.Namespace):
    from interlock.engine import EngineConfig
    from interlock.protocol.speculative import SpeculativeConfig

    return EngineConfig(speculative=SpeculativeConfig.parse(args.speculative, max_draft_len=3), max_batch_size=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--speculative", default="ngram+forced")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--save", help="also write the JSON here")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    result = anyio.run(_main, args)
    print_table("log cost (tokens/s, modes alternating)", ["mode", "runs", "median"],
                [[m, ", ".join(map(str, v)), result["median_tokens_per_s"][m]] for m, v in result["tokens_per_s"].items()])
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=2) + "\n")
    print_json_last({k: v for k, v in result.items() if k != "token_ids"})


if __name__ == "__main__":
    main()
