"""`python -m interlock.benchmarks.prefill_limit`: how close prefill runs to what the machine can do.

1. The attainable GEMM throughput, best of N on each of three problems (M x K x N: 512 x 2048 x
   2048, 256 x 1024 x 1024, and 256 x 576 x 1536, the shape of SmolLM2's MLP): our native int8
   kernel (`int8_linear`: activations quantized in blocks, int8 dots on AMX, VNNI or the portable
   path), oneDNN's int8 through torch (`torch._int_mm`), and torch's fp32 and bf16 GEMMs. The
   highest of all is "peak" (a large square alone understates it where its weights leave the
   caches).
2. One prompt chunk's forward (the engine's 256 tokens) at contexts 0, 512 and 2000, on the path the
   engine takes (`--path`: or the dense or rows one), profiled op by op (torch.profiler, top-level
   ops only) and grouped: the GEMMs (QKV, O, MLP: dense prompt GEMMs), attention, norms and RoPE,
   dtype conversions, the head's last row, and the rest. Each group's share of the forward, and the
   GEMMs' achieved rate as a fraction of the peak. The rows path runs every layer in one native call
   (`rows_forward`), which the profiler cannot see into: there the layers are one group and the GEMM
   rate is not reported.

Prints tables and one JSON line; saves the JSON (`--out`, default benchmarks/results/).
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from interlock.benchmarks.common import load_average, print_json_last, print_table, repeat_times
from interlock.kernels import native
from interlock.models.batch import SeqChunk, build_batch
from interlock.models.kv_cache import PagedKVCache
from interlock.models.linear import dense_dtype, quantize_int8
from interlock.models.loader import load_model
from interlock.models.names import EMBEDDED

RESULTS = Path(__file__).resolve().parent / "results"
GROUPS = {      # top-level op name fragments -> group (first match wins: the head's int8_linear before linear)
    "rows_forward": "layers_native", "int8_linear": "head", "_weight_int8pack_mm": "head",
    "linear": "gemm", "addmm": "gemm", "aten::mm": "gemm", "matmul": "gemm",
    "scaled_dot_product": "attention", "row_attention": "attention", "softmax": "attention",
    "rms_norm": "norms_rope", "rsqrt": "norms_rope", "pow": "norms_rope", "mean": "norms_rope",
    "neg": "norms_rope", "aten::cat": "norms_rope", "aten::mul": "norms_rope", "aten::add": "norms_rope",
    "silu": "norms_rope", "gelu": "norms_rope",
    "_to_copy": "conversions", "aten::to": "conversions", "copy_": "conversions",
}


def best(fn, repeats: int) -> float:
    return min(repeat_times(fn, repeats))


def gemm_peaks(m: int, k: int, n: int, repeats: int) -> dict[str, float]:
    """GOP/s (two ops per multiply-add) of each GEMM this machine has, on one [m, k] x [k, n]."""
    ops = 2 * m * k * n
    x, w = torch.randn(m, k), torch.randn(n, k) / k ** 0.5
    out = {"fp32": ops / best(lambda: F.linear(x, w), repeats) / 1e9}
    xb, wb = x.bfloat16(), w.bfloat16()
    out["bf16"] = ops / best(lambda: F.linear(xb, wb), repeats) / 1e9
    qa = torch.randint(-127, 128, (m, k), dtype=torch.int8)
    qb = torch.randint(-127, 128, (k, n), dtype=torch.int8)
    try:
        out["onednn_int8"] = ops / best(lambda: torch._int_mm(qa, qb), repeats) / 1e9
    except RuntimeError:
        pass
    q, scale = quantize_int8(w)
    if native.native_fits(q):
        scales = scale.float()
        out[f"ours_int8_{native.int8_kernel()}"] = ops / best(
            lambda: torch.ops.interlock_cpu.int8_linear(x, q, scales), repeats) / 1e9
    return {name: round(v, 1) for name, v in out.items()}


def group_of(name: str) -> str:
    return next((g for frag, g in GROUPS.items() if frag in name), "other")


def profile_chunk(lm, context: int, chunk: int) -> tuple[float, dict[str, float]]:
    """(seconds, {group: seconds}) of one forward over `chunk` prompt tokens after `context`."""
    tokens = tuple(100 + i % 1000 for i in range(context + chunk))
    kv = PagedKVCache(lm.config, num_blocks=-(-(context + chunk) // 16) + 1, block_size=16)
    kv.add_sequence(0)
    if context:
        kv.reserve(0, context)
        lm.model(build_batch([SeqChunk(0, tokens[:context], 0, ())], kv), kv)
    start = kv.reserve(0, chunk)
    batch = build_batch([SeqChunk(0, tokens[context:], start, (chunk - 1,))], kv)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        lm.model(batch, kv)
        seconds = time.perf_counter() - t
    groups: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.cpu_parent is None:                       # top-level: children are in its time
            groups[group_of(event.name)] += event.cpu_time_total / 1e6
    return seconds, dict(groups)


def gemm_ops(lm, chunk: int) -> int:
    """Multiply-adds x 2 of a chunk's dense projections (QKV, O, MLP), every layer."""
    c = lm.config
    per_layer = c.hidden_size * (c.q_size + 2 * c.kv_size) + c.q_size * c.hidden_size \
        + 3 * c.hidden_size * c.intermediate_size
    return 2 * chunk * per_layer * c.n_layers


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=EMBEDDED)
    p.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=[0, 512, 2000])
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--path", choices=["engine", "dense", "rows"], default="engine",
                   help="the prompt path: the engine's default for this machine, or one forced")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    load_before = load_average()
    shapes = [(512, 2048, 2048), (256, 1024, 1024), (256, 576, 1536)]
    peaks = {"x".join(map(str, shape)): gemm_peaks(*shape, args.repeats) for shape in shapes}
    peak = max(v for by_kind in peaks.values() for v in by_kind.values())
    kinds = list(next(iter(peaks.values())))
    print_table(f"attainable GEMM throughput, {args.threads} thread(s) (GOP/s)", ["M x K x N", *kinds],
                [[shape, *(by_kind.get(k, 0.0) for k in kinds)] for shape, by_kind in peaks.items()])
    lm = load_model(args.model)
    if args.path != "engine":
        if args.path == "rows" and lm.model.fused_rows is None:
            raise SystemExit(f"{args.model} has no rows path here (int8 weights and the native kernels)")
        lm.model.rows_prefill = args.path == "rows"
    rows = []
    for context in args.contexts:
        profile_chunk(lm, context, args.chunk)             # untimed: first-use costs (tables, pages) are not prefill's
        runs = [profile_chunk(lm, context, args.chunk) for _ in range(max(1, args.repeats // 2))]
        seconds, groups = min(runs, key=lambda r: r[0])
        total = sum(groups.values())
        gemm_rate = gemm_ops(lm, args.chunk) / groups["gemm"] / 1e9 if "gemm" in groups else None
        row = {"context": context, "chunk": args.chunk, "ms": round(seconds * 1e3, 1),
               "tokens_per_s": round(args.chunk / seconds, 1),
               "gemm_gops": None if gemm_rate is None else round(gemm_rate, 1),
               "gemm_of_peak": None if gemm_rate is None else round(gemm_rate / peak, 3),
               **{f"share_{g}": round(v / total, 3) for g, v in sorted(groups.items())}}
        rows.append(row)
    keys = sorted({k for r in rows for k in r}, key=lambda k: (not k.startswith(("context", "chunk", "ms")), k))
    print_table(f"prefill of a {args.chunk}-token chunk, {args.model}, rows path: {lm.model.rows_prefill}, "
                f"dense GEMMs in {dense_dtype()}", keys, [[r.get(k, 0.0) for k in keys] for r in rows])
    result = {"model": args.model, "threads": args.threads, "int8_kernel": native.int8_kernel(),
              "dense_dtype": str(dense_dtype()).removeprefix("torch."), "rows_prefill": lm.model.rows_prefill,
              "gemm_peaks_gops": peaks, "peak_gops": peak, "load_average_before": load_before,
              "load_average_after": load_average(), "rows": rows}
    out = Path(args.out) if args.out else RESULTS / f"prefill-limit-{date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print_json_last({**result, "saved": str(out)})


if __name__ == "__main__":
    main()
