"""`python -m interlock.benchmarks.scale_bench`: what scaling out buys on this machine.

1. Tensor parallelism: one decode/verify step (B sequences x (K+1) rows, int8 weights) through
   (a) the in-process forward, (b) TP=1 through a worker process (the transport alone: one pickled
   step down a pipe, logits back through shared memory), (c) TP=2 (two gloo ranks, one thread
   each). The model is a random SmolLM2-shaped Llama (576 wide, 8 heads / 4 KV heads so that it
   splits 2 ways; SmolLM2 itself has 9 / 3), written once as an HF safetensors checkpoint so that
   each rank reads only its slices. Reports step time (median), bytes sent to each rank per step,
   rank 0's time inside collectives (2 all-reduces per layer + the embedding's + the head's gather),
   and whether the greedy tokens of every step agree across the three.
2. Replicas: the OpenAI server on Ray Serve with 1 replica (2 CPUs) vs 2 replicas (1 CPU each) on
   a local 2-CPU Ray, `--concurrency` clients, greedy completions; output tokens/s.

Prints tables, saves raw results (TP: every step's greedy token ids) under benchmarks/results/,
and prints one JSON line last. Figures from a shared 2-core machine are noisy: compare the columns
of one run, not runs.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from interlock.protocol.speculative import DEFAULT_DRAFT_LEN
from interlock.benchmarks.common import load_average, median, print_json_last, print_table
from interlock.models.names import EMBEDDED

RESULTS = Path(__file__).resolve().parent / "results"
SHAPE = {"hidden_size": 576, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 72,
         "intermediate_size": 1536, "vocab_size": 49152}


def write_checkpoint(folder: Path, layers: int, seed: int = 0) -> None:
    """A random Llama checkpoint (bf16 safetensors + config.json) of SmolLM2's width."""
    from safetensors.torch import save_file

    from interlock.models.hf_loader import config_from_hf
    from interlock.models.llama import random_transformer
    from interlock.parallel.shard_sources import hf_state_of

    cfg = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": layers, "rms_norm_eps": 1e-5,
           "rope_theta": 100000.0, "max_position_embeddings": 2048, "tie_word_embeddings": True, **SHAPE}
    model = random_transformer(config_from_hf(cfg, "float32"), seed=seed)
    state = {k: v.to(torch.bfloat16).contiguous() for k, v in hf_state_of(model).items()}
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))


def step_plan(config, batch: int, prompt: int, k: int, steps: int):
    """(prefill chunks, [verify chunks per step], kv) for `batch` sequences; positions reserved up front."""
    from interlock.models.batch import SeqChunk
    from interlock.models.kv_cache import PagedKVCache

    gen = torch.Generator().manual_seed(0)
    kv = PagedKVCache(config, num_blocks=batch * (-(-(prompt + steps * (k + 1)) // 16)), block_size=16)
    prefill, verify = [], [[] for _ in range(steps)]
    for s in range(batch):
        kv.add_sequence(s)
        kv.reserve(s, prompt + steps * (k + 1))
        ids = torch.randint(0, config.vocab_size, (prompt + steps * (k + 1),), generator=gen).tolist()
        prefill.append(SeqChunk(s, tuple(ids[:prompt]), 0, (prompt - 1,)))
        for i in range(steps):
            start = prompt + i * (k + 1)
            verify[i].append(SeqChunk(s, tuple(ids[start: start + k + 1]), start, tuple(range(k + 1))))
    return prefill, verify, kv


def bench_tp(args: argparse.Namespace) -> dict:
    from interlock.models.batch import build_batch
    from interlock.models.hf_loader import load_hf_dir
    from interlock.models.llama import Transformer
    from interlock.parallel.group import TensorParallelGroup, TPConfig
    from interlock.protocol.messages import BlockTables

    folder = Path(tempfile.mkdtemp(prefix="interlock-scale-"))
    try:
        write_checkpoint(folder, args.layers)
        config, state = load_hf_dir(folder, "float32")      # weights only: the folder has no tokenizer
        model = Transformer(config)
        model.load_hf_state_dict(state)
        model.build("int8")
        del state
        prefill, verify, kv = step_plan(config, args.batch, args.prompt, args.draft_len, args.steps)
        tables = BlockTables(kv.block_size, tuple((s, kv.block_table(s)) for s in sorted(kv.sequences)))
        rows: dict[str, dict] = {}

        def run(name: str, forward, extra=lambda: {}) -> None:
            forward(prefill)
            times, tokens = [], []
            for chunks in verify:
                t0 = time.perf_counter()
                logits = forward(chunks)
                times.append(time.perf_counter() - t0)
                tokens.append(logits.argmax(-1).tolist())
            rows[name] = {"step_ms": round(median(times) * 1e3, 2), "tokens": tokens, **extra()}

        torch.set_num_threads(1)
        run("in-process", lambda chunks: model(build_batch(chunks, kv), kv))
        for world in (1, 2):
            config = TPConfig(world=world, num_blocks=kv.num_blocks, max_rows=args.batch * (args.draft_len + 1))
            with TensorParallelGroup(str(folder), config, weights="int8") as tp:
                before = {}

                def forward(chunks, tp=tp):
                    return tp.forward(chunks, tables)

                def extra(tp=tp) -> dict:
                    per_step = (tp.stats.collective_s - before["c"]) / len(verify) * 1e3
                    n = 2 * args.layers + 2
                    return {"broadcast_bytes_per_step": tp.stats.last_broadcast_bytes,
                            "collective_ms_per_step": round(per_step, 3),
                            "collectives_per_step": n if world > 1 else 0,
                            "ms_per_collective": round(per_step / n, 4) if world > 1 else 0.0}

                tp.forward(prefill, tables)
                before["c"] = tp.stats.collective_s
                run(f"TP={world}", forward, extra)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ref = rows["in-process"]["tokens"]
    for r in rows.values():
        r["greedy_tokens_equal_in_process"] = r["tokens"] == ref
    return rows


def bench_replicas(args: argparse.Namespace) -> dict:
    import ray
    from ray import serve

    from interlock.server.config import ServerConfig
    from interlock.server.ray_serve import DEPLOYMENT, ReplicaConfig, build_app

    prompts = [f"Write a short note about item {i}." for i in range(args.requests)]
    out: dict[str, dict] = {}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for n in (1, 2):
            replicas = ReplicaConfig.fixed(n, cpus_per_replica=2 / n, engine_options={"max_batch_size": args.concurrency})
            serve.run(build_app(args.model, ServerConfig(model_name="m"), replicas), name=DEPLOYMENT,
                      route_prefix="/", blocking=False)
            out[f"{n} replica(s)"] = asyncio.run(_load(f"http://127.0.0.1:{port}", prompts, args))
            serve.delete(DEPLOYMENT)
        texts = {name: [r["text"] for r in run["results"]] for name, run in out.items()}
        for run in out.values():
            run["same_texts_as_1_replica"] = texts["1 replica(s)"] == [r["text"] for r in run["results"]]
    finally:
        serve.shutdown()
        ray.shutdown()
    return out


async def _load(url: str, prompts: list[str], args: argparse.Namespace) -> dict:
    import httpx

    limiter = asyncio.Semaphore(args.concurrency)
    results: list[dict] = []

    async def one(client: httpx.AsyncClient, prompt: str) -> None:
        async with limiter:
            r = await client.post("/v1/completions", json={"model": "m", "prompt": prompt,
                                                           "max_tokens": args.max_tokens, "temperature": 0})
            body = r.json()
            results.append({"prompt": prompt, "status": r.status_code, "replica": r.headers.get("x-interlock-replica"),
                            "text": body["choices"][0]["text"] if r.status_code == 200 else None,
                            "tokens": body["usage"]["completion_tokens"] if r.status_code == 200 else 0})

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await one(client, prompts[0])                  # warm-up (first compile of a path, caches)
        results.clear()
        start = time.perf_counter()
        await asyncio.gather(*[one(client, p) for p in prompts])
        wall = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in results)
    return {"requests": len(results), "ok": sum(r["status"] == 200 for r in results), "output_tokens": tokens,
            "wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 2),
            "replicas_used": len({r["replica"] for r in results}), "results": sorted(results, key=lambda r: r["prompt"])}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--draft-len", type=int, default=DEFAULT_DRAFT_LEN)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--model", default=EMBEDDED, help="replica benchmark's model")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--skip-tp", action="store_true")
    p.add_argument("--skip-replicas", action="store_true")
    args = p.parse_args()
    result: dict = {"args": vars(args), "load_average": load_average(), "cpus": os.cpu_count()}
    if not args.skip_tp:
        tp = result["tp"] = bench_tp(args)
        base = tp["in-process"]["step_ms"]
        print_table(f"one verify step, {args.batch} seqs x {args.draft_len + 1} rows, {args.layers} layers, int8",
                    ["path", "step ms", "vs in-process", "bytes/rank/step", "collective ms/step", "ms/collective",
                     "greedy == in-process"],
                    [[name, r["step_ms"], f"{r['step_ms'] / base:.2f}x", r.get("broadcast_bytes_per_step", "-"),
                      r.get("collective_ms_per_step", "-"), r.get("ms_per_collective", "-"),
                      r["greedy_tokens_equal_in_process"]] for name, r in tp.items()])
    if not args.skip_replicas:
        reps = result["replicas"] = bench_replicas(args)
        one = reps["1 replica(s)"]["tokens_per_s"]
        print_table(f"{args.model}, {args.requests} requests, concurrency {args.concurrency}, {args.max_tokens} tokens",
                    ["deployment", "ok", "output tok/s", "vs 1 replica", "replicas used", "same texts"],
                    [[name, f"{r['ok']}/{r['requests']}", r["tokens_per_s"], f"{r['tokens_per_s'] / one:.2f}x",
                      r["replicas_used"], r["same_texts_as_1_replica"]] for name, r in reps.items()])
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"scale-{time.strftime('%Y-%m-%d')}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    summary = {"saved": str(path)}
    if "tp" in result:
        summary.update({f"{k}_step_ms": v["step_ms"] for k, v in result["tp"].items()})
    if "replicas" in result:
        summary.update({f"{k}_tok_s": v["tokens_per_s"] for k, v in result["replicas"].items()})
    print_json_last(summary)


if __name__ == "__main__":
    main()
