"""`python -m interlock.benchmarks.serve_bench`: what HTTP costs. JSONSchemaBench rows through
`interlock serve` (a subprocess, streamed with SSE over loopback) and through the in-process
Engine, at several concurrencies, side by side in one run.

Per mode and concurrency: output tokens/s over wall time, TTFT and inter-token latency p50/p99
(ITL: gaps between streamed deltas; a speculative step delivers several tokens in one), and how
many outputs are identical between the two paths (greedy: all should be). The HTTP path includes
what a user pays: request parsing, the server's grammar compile before submission, SSE framing
and the client's parsing. Prints a table, saves raw results (in-process token ids, every text)
under benchmarks/results/, and prints one JSON line last.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import anyio

from interlock.benchmarks.common import load_average, percentile, print_json_last, print_table
from interlock.benchmarks.prompts import Row, build_messages, dataset_arg, load_rows
from interlock.engine import Engine, EngineConfig
from interlock.models.loader import LoadedModel, load_model
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import DEFAULT_DRAFT_LEN, SpeculativeConfig
from interlock.models.names import EMBEDDED

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Sample:
    row: str
    text: str
    tokens: int
    ttft_s: float
    gaps_s: tuple[float, ...]
    token_ids: tuple[int, ...] = ()


def summarize(path: str, concurrency: int, samples: list[Sample], wall: float) -> dict:
    gaps = [g for s in samples for g in s.gaps_s]
    tokens = sum(s.tokens for s in samples)
    return {"path": path, "concurrency": concurrency, "requests": len(samples), "output_tokens": tokens,
            "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2),
            "ttft_p50_ms": round(percentile([s.ttft_s for s in samples], 50) * 1e3, 1),
            "ttft_p99_ms": round(percentile([s.ttft_s for s in samples], 99) * 1e3, 1),
            "itl_p50_ms": round(percentile(gaps, 50) * 1e3, 2), "itl_p99_ms": round(percentile(gaps, 99) * 1e3, 2)}


async def run_rows(rows: list[Row], concurrency: int, one) -> tuple[list[Sample], float]:
    samples: list[Sample] = []
    limiter = anyio.Semaphore(concurrency)

    async def task(row: Row) -> None:
        async with limiter:
            samples.append(await one(row))

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for row in rows:
            tg.start_soon(task, row)
    return samples, time.perf_counter() - start


async def in_process(loaded: LoadedModel, rows: list[Row], concurrency: int, args: argparse.Namespace) -> tuple[list[Sample], float]:
    config = EngineConfig(speculative=SpeculativeConfig.parse(args.speculative, max_draft_len=args.draft_len),
                          max_batch_size=concurrency, threads=args.threads)
    sampling = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, seed=0)
    async with Engine(loaded, config) as engine:
        async def one(row: Row) -> Sample:
            t0 = time.perf_counter()
            last, ttft, gaps, text, ids = t0, 0.0, [], [], []
            async for delta in engine.generate(build_messages(row), grammar=JsonSchema(row.schema), sampling=sampling):
                now = time.perf_counter()
                if delta.text or delta.token_ids:
                    if not ids:
                        ttft = now - t0
                    else:
                        gaps.append(now - last)
                    last = now
                text.append(delta.text)
                ids.extend(delta.token_ids)
            return Sample(row.id, "".join(text), len(ids), ttft, tuple(gaps), tuple(ids))

        return await run_rows(rows, concurrency, one)


def start_server(port: int, concurrency: int, args: argparse.Namespace) -> subprocess.Popen:
    import interlock

    env = {**os.environ, "PYTHONPATH": str(Path(interlock.__file__).parent.parent), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "interlock.cli", "serve", "--model", args.model, "--port", str(port),
                             "--speculative", args.speculative, "--draft-len", str(args.draft_len),
                             "--max-batch-size", str(concurrency), "--max-tokens", str(args.max_tokens)]
                            + ([] if args.threads is None else ["--threads", str(args.threads)]),
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


async def over_http(rows: list[Row], concurrency: int, args: argparse.Namespace) -> tuple[list[Sample], float]:
    import httpx

    port = args.port + concurrency
    url = f"http://127.0.0.1:{port}"
    proc = start_server(port, concurrency, args)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=600,
                                     limits=httpx.Limits(max_connections=concurrency + 1)) as client:
            with anyio.fail_after(300):
                while True:
                    try:
                        if (await client.get("/health")).status_code == 200:
                            break
                    except httpx.TransportError:
                        if proc.poll() is not None:
                            raise RuntimeError("server exited: " + proc.communicate()[1][-2000:])
                    await anyio.sleep(0.2)

            async def one(row: Row) -> Sample:
                body = {"model": args.model, "messages": build_messages(row), "temperature": 0, "seed": 0,
                        "max_tokens": args.max_tokens, "stream": True, "stream_options": {"include_usage": True},
                        "response_format": {"type": "json_schema",
                                            "json_schema": {"name": "row", "schema": row.schema, "strict": True}}}
                t0 = time.perf_counter()
                last, ttft, gaps, text, tokens = t0, 0.0, [], [], 0
                async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if chunk.get("usage"):
                            tokens = chunk["usage"]["completion_tokens"]
                        for c in chunk.get("choices", []):
                            piece = c["delta"].get("content")
                            if piece:
                                now = time.perf_counter()
                                if not text:
                                    ttft = now - t0
                                else:
                                    gaps.append(now - last)
                                last = now
                                text.append(piece)
                return Sample(row.id, "".join(text), tokens, ttft, tuple(gaps))

            return await run_rows(rows, concurrency, one)
    finally:
        proc.terminate()
        proc.wait(60)


async def main_async(args: argparse.Namespace) -> dict:
    rows = load_rows(args.dataset, limit=args.limit)
    loaded = load_model(args.model)
    load_before = load_average()
    table, raw = [], []
    for c in args.concurrency:
        local, local_wall = await in_process(loaded, rows, c, args)
        http, http_wall = await over_http(rows, c, args)
        same = {s.row: s.text for s in local}
        a, b = summarize("in-process", c, local, local_wall), summarize("http", c, http, http_wall)
        b["vs_in_process"] = round(b["tokens_per_s"] / max(a["tokens_per_s"], 1e-9), 3)
        b["same_text"] = sum(same.get(s.row) == s.text for s in http)
        table += [a, b]
        raw += [{"path": p, "concurrency": c, "row": s.row, "text": s.text, "tokens": s.tokens,
                 "token_ids": list(s.token_ids)} for p, ss in (("in-process", local), ("http", http)) for s in ss]
    return {"dataset": Path(args.dataset).stem, "rows": len(rows), "model": args.model, "speculative": args.speculative,
            "draft_len": args.draft_len, "max_tokens": args.max_tokens, "load_average_before": load_before,
            "load_average_after": load_average(), "cpus": os.cpu_count(), "results": table, "raw": raw}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", type=dataset_arg, default="JME", help="a JSONSchemaBench set (name or .jsonl path)")
    p.add_argument("--limit", type=int, default=32)
    p.add_argument("--model", default=EMBEDDED)
    p.add_argument("--speculative", default="ngram+forced")
    p.add_argument("--draft-len", type=int, default=DEFAULT_DRAFT_LEN)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    p.add_argument("--port", type=int, default=18700)
    p.add_argument("--threads", type=int, default=None,
                   help="the model lane's torch threads, both paths (default: the engine's, min(2, cores))")
    p.add_argument("--out", default=None, help="result JSON (default benchmarks/results/serve-DATE.json)")
    args = p.parse_args(argv)
    import torch

    from interlock.logs import configure_logging

    configure_logging(level="warning")

    torch.set_num_threads(1)        # the engine's model lane alone runs torch in parallel (EngineConfig.threads)
    result = anyio.run(main_async, args)
    keys = ["path", "concurrency", "requests", "output_tokens", "tokens_per_s", "vs_in_process", "same_text",
            "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"]
    print_table(f"serve_bench: {result['dataset']}, {result['rows']} rows, {result['speculative']} K={result['draft_len']}, "
                f"load average {result['load_average_before']}", keys,
                [[r.get(k, "") for k in keys] for r in result["results"]])
    out = Path(args.out) if args.out else RESULTS / f"serve-{time.strftime('%Y-%m-%d')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print_json_last({"results": result["results"], "saved": str(out), "load_average_before": result["load_average_before"],
                     "load_average_after": result["load_average_after"]})


if __name__ == "__main__":
    main()
