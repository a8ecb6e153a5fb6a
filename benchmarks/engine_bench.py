"""`interlock bench`: JSONSchemaBench rows as constrained requests, end to end through the engine.

Prompts come from benchmarks/prompts.py (schema in the system message, the facts of the row's
valid instance in prose). With `repeat_schema` (`--repeat-schema ROW`), the rows are one row's schema
with --limit documents made from its instance (benchmarks/workloads.py): the repeated-schema job,
where prefix caching and suffix drafts pay. Several speculative modes (comma-separated) run one after the other on
the same rows and model in one process, so their ratios are measured side by side. Progress goes
to stderr; `report` prints the tables (tokens/s ratio to the first mode); the CLI writes the
results as JSON only when asked (`--json` on stdout, `--out FILE`).
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import anyio
from rich.console import Console
from rich.progress import Progress

from interlock.benchmarks.common import percentile, print_table
from interlock.benchmarks.prompts import Row, build_prompt, dataset_arg, is_valid, load_rows
from interlock.benchmarks.workloads import repeated_schema, row_by_id
from interlock.engine import Engine, EngineConfig
from interlock.models.loader import LoadedModel
from interlock.protocol.errors import InterlockError
from interlock.protocol.grammar import GrammarConfig, JsonSchema
from interlock.protocol.sampling import Completion, SamplingParams
from interlock.protocol.speculative import DEFAULT_DRAFT_LEN, SpeculativeConfig, SuffixConfig

T = TypeVar("T")


@dataclass(frozen=True)
class BenchConfig:
    dataset: Path
    limit: int | None = None
    speculative: str = "ngram+forced"
    draft_len: int = DEFAULT_DRAFT_LEN
    backend: str = "auto"
    concurrency: int = 1
    max_tokens: int = 256
    temperature: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    prefix_caching: bool = True
    threads: int | None = None          # the model lane's torch threads (EngineConfig.threads)
    prefill: str = "auto"               # EngineConfig.prefill
    repeat_schema: str | None = None    # a row id of `dataset`: its schema, `limit` documents (default 50)
    repeats: int = 1                    # each row this many times in a row (a warm-up and timed runs)
    suffix: SuffixConfig | None = None  # the suffix drafter's settings (None: SuffixConfig's defaults)
    device: str = "cpu"                 # EngineConfig.device
    batched_masks: bool | None = None   # GrammarConfig.batched_masks (None: by the runner)


def bench_rows(cfg: BenchConfig) -> list[Row]:
    """The rows a bench runs (KeyError: no such row; ValueError: it cannot be varied into `limit` documents)."""
    if cfg.repeat_schema is None:
        return load_rows(cfg.dataset, limit=cfg.limit)
    return repeated_schema(row_by_id(cfg.dataset, cfg.repeat_schema), cfg.limit or 50)


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """The rows benchmarks/ab.py runs: --dataset, --limit, --repeat-schema, --repeats."""
    p.add_argument("--dataset", type=dataset_arg, default="JME", help="a JSONSchemaBench set (name or .jsonl path)")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--repeat-schema", metavar="ROW", default=None,
                   help="one row's schema over --limit documents (interlock bench's repeated-schema workload)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each prompt in a row (the first a warm-up)")


def workload(p: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[BenchConfig, str]:
    """The BenchConfig of add_workload_args' flags and a title for it; a row that is not there is a
    usage error before any model loads (as in `interlock bench`)."""
    cfg = BenchConfig(dataset=args.dataset, limit=args.limit, repeat_schema=args.repeat_schema, repeats=args.repeats)
    try:
        bench_rows(cfg)
    except (KeyError, ValueError) as exc:
        p.error(f"argument --repeat-schema: {exc.args[0]}")
    rows = f"{args.limit} documents of {args.repeat_schema}" if args.repeat_schema else f"{args.limit} {args.dataset.stem} rows"
    return cfg, f"{rows} x {args.repeats}"


def valid(completion: Completion, row: Row) -> bool:
    return is_valid(completion.text, row.schema)


async def run_bench(loaded: LoadedModel, cfg: BenchConfig, progress: bool = True) -> dict:
    rows = bench_rows(cfg)
    fields = {} if cfg.suffix is None else {"suffix": cfg.suffix}
    config = EngineConfig(speculative=SpeculativeConfig.parse(cfg.speculative, max_draft_len=cfg.draft_len, **fields),
                          grammar=GrammarConfig(backend=cfg.backend, batched_masks=cfg.batched_masks),
                          max_batch_size=cfg.concurrency,
                          prefix_caching=cfg.prefix_caching, threads=cfg.threads, prefill=cfg.prefill,
                          device=cfg.device)
    sampling = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=0,
                              presence_penalty=cfg.presence_penalty, frequency_penalty=cfg.frequency_penalty,
                              repetition_penalty=cfg.repetition_penalty)
    results: list[tuple[Row, Completion | None]] = []
    console = Console(stderr=True, highlight=False, soft_wrap=True)    # progress on stderr; stdout keeps results
    async with Engine(loaded, config) as engine:
        limiter = anyio.Semaphore(cfg.concurrency)
        with Progress(console=console, disable=not progress, transient=True) as bar:
            task = bar.add_task(f"{cfg.dataset.stem} {cfg.speculative}", total=len(rows) * cfg.repeats)

            async def one(row: Row) -> None:
                async with limiter:
                    for _ in range(cfg.repeats):
                        try:
                            c = await engine.complete(build_prompt(row, engine.tokenizer), grammar=JsonSchema(row.schema),
                                                      sampling=sampling)
                        except InterlockError:
                            c = None
                        results.append((row, c))
                        bar.advance(task)

            start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for row in rows:
                    tg.start_soon(one, row)
            wall = time.perf_counter() - start
        metrics = await engine.metrics()
    done = [(r, c) for r, c in results if c is not None]
    reasons = Counter(c.finish_reason if c is not None else "error" for _, c in results)
    tokens = sum(len(c.token_ids) for _, c in done)
    if progress:
        console.print(f"{cfg.speculative}{'' if cfg.prefix_caching else ' (no prefix cache)'}: "
                      f"{len(results)} requests, {tokens} tokens in {wall:.1f} s ({tokens / wall:.1f} tokens/s)",
                      style="dim")
    steps = sum(c.stats.steps for _, c in done)
    step_tokens = sum(c.stats.step_tokens for _, c in done)
    return {
        "mode": cfg.speculative + ("" if cfg.prefix_caching else " (no prefix cache)"),
        "prefix_caching": cfg.prefix_caching, "prefill": cfg.prefill, "prompt_tokens": metrics.prompt_tokens,
        "cached_prompt_tokens": metrics.cached_prompt_tokens, "backend": cfg.backend, "concurrency": cfg.concurrency,
        "requests": len(rows), "completed": len(done), "valid": sum(valid(c, r) for r, c in done),
        "finish_reasons": {k: reasons.get(k, 0) for k in ("stop", "length", "error")},
        # Outputs that ended with "stop" yet fail their schema: the engine's end-of-request check
        # turns those into errors, so this must be 0.
        "invalid_stop": sum(c.finish_reason == "stop" and not valid(c, r) for r, c in done),
        "output_tokens": tokens, "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2),
        "mean_acceptance_length": round(step_tokens / steps, 3) if steps else 0.0,
        "exposed_grammar_frac": round(metrics.exposed_grammar_frac, 4),
        "ttft_p50_s": round(percentile([c.stats.ttft_s for _, c in done], 50), 4) if done else 0.0,
        # One request at a time, the wall is this plus the decode after each first token: what
        # speculation cannot shorten (a prompt's prefill and its first step).
        "ttft_total_s": round(sum(c.stats.ttft_s for _, c in done), 3),
        "engine_steps": metrics.steps,
        "messages_per_step": round(metrics.messages_per_step, 2),
        "wakeups_per_step": round(metrics.wakeups_per_step, 2),
        "host_ms_per_step": round(1e3 * metrics.host_s / metrics.steps, 3) if metrics.steps else 0.0,
        "draft_len": cfg.draft_len, "max_tokens": cfg.max_tokens, "temperature": cfg.temperature,
        "penalties": {"presence": cfg.presence_penalty, "frequency": cfg.frequency_penalty,
                      "repetition": cfg.repetition_penalty},
        "dataset": cfg.dataset.stem, "repeat_schema": cfg.repeat_schema, "repeats": cfg.repeats,
        "outputs": [{"id": r.id, "finish_reason": c.finish_reason if c else "error",
                     "token_ids": list(c.token_ids) if c else []} for r, c in sorted(results, key=lambda x: x[0].id)],
    }


def round_order(sides: Sequence[T], r: int) -> Sequence[T]:
    """The order of the sides in round r: as given, reversed every other round (A B C, C B A, ...),
    so a drifting host's speed falls on every side alike."""
    return sides if r % 2 == 0 else sides[::-1]


async def run_modes(loaded: LoadedModel, cfg: BenchConfig, modes: list[str], progress: bool = True,
                    prefix_caching: tuple[bool, ...] | None = None, rounds: int = 1) -> list[dict]:
    """run_bench for each mode (and each prefix-caching setting), `rounds` times with the order reversed
    every other round (`round_order`). A mode's result is its median run by tokens/s (the lower middle one for an even count: a run, not
    an average), with every run's tokens/s when there are several, and its ratio to the first mode's."""
    sides = [(mode, caching) for mode in modes for caching in prefix_caching or (cfg.prefix_caching,)]
    runs: dict[tuple[str, bool], list[dict]] = {side: [] for side in sides}
    for r in range(rounds):
        for mode, caching in round_order(sides, r):
            runs[(mode, caching)].append(
                await run_bench(loaded, replace(cfg, speculative=mode, prefix_caching=caching), progress))
    results = []
    for side in sides:
        by_speed = sorted(runs[side], key=lambda x: x["tokens_per_s"])
        result = dict(by_speed[(len(by_speed) - 1) // 2])
        if rounds > 1:
            result["runs_tokens_per_s"] = [x["tokens_per_s"] for x in runs[side]]
        results.append(result)
    for result in results:
        result["ratio"] = round(result["tokens_per_s"] / max(results[0]["tokens_per_s"], 1e-9), 3)
    return results


def same_tokens(runs: dict[str, list[dict]]) -> bool:
    """Whether every run_bench result in `runs` (side -> its runs) gave every row the same tokens."""
    outputs = [[o["token_ids"] for o in x["outputs"]] for results in runs.values() for x in results]
    return all(o == outputs[0] for o in outputs)


def report(results: list[dict], console: Console | None = None) -> None:
    """The results as two tables on `console` (default: stdout)."""
    keys = ["mode", "completed", "valid", "stop/length/error", "invalid_stop", "output_tokens", "tokens_per_s",
            "ratio", "mean_acceptance_length", "exposed_grammar_frac", "ttft_p50_s", "cached_prompt_tokens"]
    runtime = ["mode", "engine_steps", "messages_per_step", "wakeups_per_step", "host_ms_per_step", "wall_s",
               "ttft_total_s"]
    first = results[0]
    rows = (f"{first['requests']} documents with {first['repeat_schema']}'s schema" if first.get("repeat_schema")
            else f"{first['requests']} rows")
    title = (f"interlock bench: {first['dataset']}, {rows}, T={first['temperature']}, "
             f"K={first['draft_len']}, concurrency {first['concurrency']}, backend {first['backend']}")
    if "runs_tokens_per_s" in first:
        title += f", each mode's median of {len(first['runs_tokens_per_s'])} alternating runs"
        runtime = [*runtime, "runs_tokens_per_s"]
    shown = [{**r, "stop/length/error": "/".join(str(r["finish_reasons"][k]) for k in ("stop", "length", "error"))}
             for r in results]
    out = console or Console(file=sys.stdout)
    wide = Console(file=out.file, width=None if out.is_terminal else 200)   # 11 columns: 120 wraps headers
    print_table(title, keys, [[r.get(k, "") for k in keys] for r in shown], console=wide)
    print_table("per step: actor messages, event-loop wake-ups, host time outside the lanes; the run's wall and "
                "its requests' summed time to first token", runtime,
                [[r.get(k, "") for k in runtime] for r in shown], console=wide)
