"""law="conditional" against law="masked" on JSONSchemaBench prompts: attempts and tokens per
accepted sample, wall time per sample, and how many ran out of attempts.

    python -m interlock.benchmarks.conditional_bench --dataset JME --limit 3 --samples 2 \
        --out benchmarks/results/conditional-jme3-zen4-2026-12-02.json

Each row's prompt (benchmarks/prompts.py) and schema are run `--samples` times per law, seeded, one
request at a time, on one engine (prefix caching on: each attempt re-prefills the cached prompt).
tokens_per_sample counts every token drawn: the accepted output's and the rejected attempts'.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from interlock.benchmarks.prompts import build_prompt, dataset_arg, is_valid, load_rows
from interlock.engine import Engine
from interlock.protocol.errors import ConditionalAttemptsError
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import SamplingParams

LAWS = ("masked", "conditional")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rows = load_rows(args.dataset, args.limit)
    engine = Engine.from_pretrained(args.model, speculative=args.speculative)
    out: dict[str, Any] = {"command": " ".join(sys.argv), "model": args.model, "speculative": args.speculative,
                           "temperature": args.temperature, "max_tokens": args.max_tokens,
                           "max_attempts": args.max_attempts, "machine": platform.machine(), "rows": []}
    async with engine:
        for row in rows:
            prompt, grammar = build_prompt(row, engine.tokenizer), JsonSchema(row.schema)
            result: dict[str, Any] = {"id": row.id}
            for law in LAWS:
                result[law] = await _law(engine, prompt, grammar, row.schema, law, args)
            out["rows"].append(result)
            print(json.dumps(result), file=sys.stderr)
        out["metrics"] = {k: v for k, v in vars(await engine.metrics()).items() if k.startswith("conditional")}
    out["summary"] = {law: _summary([r[law] for r in out["rows"]]) for law in LAWS}
    return out


async def _law(engine: Engine, prompt, grammar, schema, law: str, args: argparse.Namespace) -> dict[str, Any]:
    samples = []
    for seed in range(args.samples):
        sampling = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=seed, law=law,
                                  max_attempts=args.max_attempts)
        start = time.perf_counter()
        try:
            c = await engine.complete(prompt, grammar=grammar, sampling=sampling)
        except ConditionalAttemptsError:
            samples.append({"accepted": False, "wall_s": time.perf_counter() - start, "attempts": args.max_attempts})
            continue
        samples.append({"accepted": True, "wall_s": time.perf_counter() - start, "attempts": c.stats.attempts,
                        "tokens": c.stats.output_tokens + c.stats.rejected_tokens, "finish": c.finish_reason,
                        "valid": c.finish_reason == "stop" and is_valid(c.text, schema)})
    return {"samples": samples}


def _summary(per_row: list[dict[str, Any]]) -> dict[str, Any]:
    samples = [s for r in per_row for s in r["samples"]]
    ok = [s for s in samples if s["accepted"]]
    mean = lambda xs: round(sum(xs) / len(xs), 3) if xs else None  # noqa: E731
    return {"samples": len(samples), "accepted": len(ok), "valid": sum(s.get("valid", False) for s in ok),
            "attempts_per_accepted": mean([s["attempts"] for s in ok]),
            "tokens_per_accepted": mean([s["tokens"] for s in ok]),
            "wall_s_per_sample": mean([s["wall_s"] for s in samples])}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", type=dataset_arg, default=dataset_arg("JME"))
    p.add_argument("--limit", type=int, default=3)
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--speculative", default="ngram+forced")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--max-attempts", type=int, default=16)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    result = anyio.run(run, args)
    text = json.dumps(result, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
