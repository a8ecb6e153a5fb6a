"""`python -m interlock.benchmarks.prefill_speed`: prompt-chunk prefill speed of the forward.

Per context length (tokens already in the cache): the best-of-N time of one forward over a
prompt chunk (the engine's default 256 tokens), as tokens/s, on the prompt paths measured side by
side: the rows path (int8 rows kernels, batch invariant: `EngineConfig.prefill="rows"`, the
default where the CPU has AMX or AVX512-VNNI) and the dense path (GEMMs with the unquantized
weights, and SDPA) with its GEMMs in bf16 and in fp32 (`models.linear.dense_dtype` picks bf16 only
where the CPU has bf16 dot products). Prints a table and one JSON line; saves the JSON under
benchmarks/results/.
"""
from __future__ import annotations

import argparse
import json
import time
from datetime import date
from pathlib import Path

import torch

from interlock.kernels import native
from interlock.benchmarks.common import load_average, print_json_last, print_table, repeat_times
from interlock.models.batch import SeqChunk, build_batch
from interlock.models.kv_cache import PagedKVCache
from interlock.models.linear import dense_dtype
from interlock.models.loader import LoadedModel, load_model
from interlock.models.names import EMBEDDED

RESULTS = Path(__file__).resolve().parent / "results"


def best_of(fn, repeats: int) -> float:
    return min(repeat_times(fn, repeats))


def forward_chunk(lm: LoadedModel, context: int, chunk: int, repeats: int) -> float:
    """Seconds for one forward over `chunk` prompt tokens after `context` cached ones."""
    tokens = tuple(100 + i % 1000 for i in range(context + chunk))
    blocks = -(-(context + chunk) // 16) + 1

    def once() -> float:
        kv = PagedKVCache(lm.config, num_blocks=blocks, block_size=16)
        kv.add_sequence(0)
        if context:
            kv.reserve(0, context)
            lm.model(build_batch([SeqChunk(0, tokens[:context], 0, ())], kv), kv)
        start = kv.reserve(0, chunk)
        batch = build_batch([SeqChunk(0, tokens[context:], start, (chunk - 1,))], kv)
        t = time.perf_counter()
        lm.model(batch, kv)
        return time.perf_counter() - t

    once()
    return min(once() for _ in range(repeats))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=EMBEDDED)
    p.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=[0, 200, 512, 1000])
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (the engine's model lane: 2)")
    p.add_argument("--out", default=None, help="result JSON (default benchmarks/results/prefill-DATE.json)")
    p.add_argument("--paths", type=lambda s: s.split(","), default=["rows", "dense_bf16", "dense_fp32"],
                   help="rows, dense_bf16, dense_fp32 (the rows path on the portable kernel, without VNNI, takes "
                        "minutes at long contexts)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(args.model)
    load_before = load_average()
    rows = []
    can_rows = lm.model.fused_rows is not None
    for context in args.contexts:
        row = {"context": context, "chunk": args.chunk}
        for path in (q for q in args.paths if q != "rows" or can_rows):
            lm.model.rows_prefill = path == "rows"
            lm.model.set_dense_dtype(torch.bfloat16 if path == "dense_bf16" else torch.float32)
            forward = forward_chunk(lm, context, args.chunk, args.repeats)
            row[f"{path}_ms"] = round(forward * 1e3, 2)
            row[f"{path}_tokens_per_s"] = round(args.chunk / forward, 1)
        if "dense_bf16_ms" in row and "dense_fp32_ms" in row:
            row["fp32_over_bf16_speed"] = round(row["dense_bf16_ms"] / row["dense_fp32_ms"], 2)
        if "rows_ms" in row and "dense_fp32_ms" in row:
            row["rows_over_fp32_speed"] = round(row["dense_fp32_ms"] / row["rows_ms"], 2)
        rows.append(row)
    lm.model.rows_prefill = lm.model.rows_prefill_default
    lm.model.set_dense_dtype(dense_dtype())
    result = {"model": args.model, "threads": args.threads, "int8_kernel": native.int8_kernel(),
              "dense_dtype": str(dense_dtype()).removeprefix("torch."), "repeats": args.repeats, "weights": lm.model.weights,
              "n_layers": lm.config.n_layers, "load_average_before": load_before, "load_average_after": load_average(),
              "rows": rows}
    keys = list(rows[0])
    print_table(f"prefill of a {args.chunk}-token chunk, {args.model}, {args.threads} thread(s)", keys,
                [[r[k] for k in keys] for r in rows])
    out = Path(args.out) if args.out else RESULTS / f"prefill-{date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print_json_last({**result, "saved": str(out)})


if __name__ == "__main__":
    main()
