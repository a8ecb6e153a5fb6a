"""`python -m interlock.benchmarks.gc_pauses`: what Python's garbage collector costs a stream.

Runs the same JME requests (greedy, one at a time) through one engine with `freeze_gc` off and one
with it on, alternating rounds, and records every collection (generation, duration: gc.callbacks)
and every gap between two deltas of a stream, and each request's time to its first delta. A full
(generation 2) collection walks every tracked object in the process holding the GIL: the event loop
and the lanes' Python code wait for it, and a request whose step it lands in waits with them.
Prints, per setting: collections and their total time by generation, the longest and p99 gap between
deltas, TTFT p50 and max, tokens/s; saves the raw results (token ids included) under benchmarks/results/.
"""
from __future__ import annotations

import argparse
import gc
import json
import time
from datetime import date
from pathlib import Path
from typing import Any

import anyio
import torch

from interlock.benchmarks.common import percentile, print_json_last, print_table
from interlock.benchmarks.prompts import DATASETS, build_messages, load_rows
from interlock.engine import Engine, EngineConfig
from interlock.logs import configure_logging
from interlock.models.loader import EMBEDDED, load_model
from interlock.protocol.errors import InterlockError
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

RESULTS = Path(__file__).resolve().parent / "results"


class Collections:
    """gc.callbacks hook: count and seconds per generation while `on`."""

    def __init__(self) -> None:
        self.on = False
        self.by_gen = {g: [0, 0.0] for g in range(3)}
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self.on:
            entry = self.by_gen[info["generation"]]
            entry[0] += 1
            entry[1] += time.perf_counter() - self._start


async def run(loaded: Any, rows: list, freeze: bool, mode: str, max_tokens: int) -> dict[str, Any]:
    collections = Collections()
    gc.callbacks.append(collections)
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    config = EngineConfig(speculative=SpeculativeConfig.parse(mode), freeze_gc=freeze)
    gaps: list[float] = []
    ttfts: list[float] = []
    outputs: list[dict[str, Any]] = []
    tokens = 0
    try:
        async with Engine(loaded, config) as engine:
            collections.on = True
            start = time.perf_counter()
            for row in rows:
                ids: list[int] = []
                submit, last = time.perf_counter(), None
                try:
                    async for delta in engine.generate(build_messages(row), grammar=JsonSchema(row.schema),
                                                       sampling=sampling):
                        now = time.perf_counter()
                        if last is not None:
                            gaps.append(now - last)
                        else:
                            ttfts.append(now - submit)
                        last = now
                        ids.extend(delta.token_ids)
                except InterlockError as exc:
                    outputs.append({"id": row.id, "error": repr(exc)})
                    continue
                tokens += len(ids)
                outputs.append({"id": row.id, "token_ids": ids})
            wall = time.perf_counter() - start
            collections.on = False
    finally:
        gc.callbacks.remove(collections)
    return {"freeze_gc": freeze, "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "collections": {str(g): {"count": n, "ms": 1e3 * t} for g, (n, t) in collections.by_gen.items()},
            "max_gap_ms": 1e3 * max(gaps, default=0.0),
            "max_ttft_ms": 1e3 * max(ttfts, default=0.0),
            "p50_ttft_ms": 1e3 * percentile(ttfts, 50) if ttfts else 0.0,
            "p99_gap_ms": 1e3 * percentile(gaps, 99) if gaps else 0.0,
            "outputs": outputs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=20, help="JME rows per round")
    p.add_argument("--rounds", type=int, default=2, help="rounds, each running both settings (order alternates)")
    p.add_argument("--speculative", default="ngram+forced")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    configure_logging(level="warning")
    torch.set_num_threads(1)                # the engine's model lane takes the threads (EngineConfig.threads)
    loaded = load_model(EMBEDDED)
    rows = load_rows(DATASETS / "JME.jsonl", args.limit)
    results = []
    for r in range(args.rounds):
        for freeze in ((False, True) if r % 2 == 0 else (True, False)):
            results.append(anyio.run(run, loaded, rows, freeze, args.speculative, args.max_tokens) | {"round": r})
    table = [[r["round"], r["freeze_gc"], r["collections"]["2"]["count"], round(r["collections"]["2"]["ms"], 1),
              round(r["collections"]["0"]["ms"] + r["collections"]["1"]["ms"], 1), round(r["max_gap_ms"], 1),
              round(r["p99_gap_ms"], 1), round(r["p50_ttft_ms"], 1), round(r["max_ttft_ms"], 1),
              round(r["tokens_per_s"], 1)] for r in results]
    print_table(f"garbage collection during {args.limit} JME requests, {args.speculative}",
                ["round", "freeze_gc", "full GCs", "full GC ms", "young GC ms", "max gap ms", "p99 gap ms",
                 "TTFT p50 ms", "TTFT max ms", "tokens/s"], table)
    out = Path(args.out) if args.out else RESULTS / f"gc-pauses-{date.today().isoformat()}.json"
    out.write_text(json.dumps({"args": vars(args), "results": results}))
    print_json_last({"saved": str(out), **{f"r{r['round']} freeze={r['freeze_gc']}": round(r["max_gap_ms"], 1)
                                            for r in results}})


if __name__ == "__main__":
    main()
