"""`python -m interlock.benchmarks.kernel_ab --base REV`: the CPU kernels of REV against this checkout's,
interleaved in one process.

A host whose memory bandwidth moves from minute to minute (shared machines) makes two runs of
model_speed hard to compare; here both versions are built into one extension and alternate run by
run, so they see the same machine. Two measurements, at the process's torch threads:

- gemv: every int8 projection of a SmolLM2-shaped decode step in sequence (30 layers' q/k/v, o,
  gate/up, down and the head; random weights, 134 MB), for M activation rows (1: decode, 4: a K=3
  verify step), through `int8_linear_raw` (csrc/int8_linear.h, with AMX where the CPU has it);
- attention: `attend_rows` (csrc/attention.h) over 30 layers of a paged cache (`--kv-dtype`, fp16 by
  default as the loader's beside int8 weights) at a context length, for M rows, with the weights read between layers as a step would (only the attention
  is timed), so the cache is not left in L3 by the previous layer.

REV's int8_linear.h is compiled against this checkout's int8_quant.h and int8_amx.h (the
quantized-activation layout they share), so a REV that changed those is out of reach. Prints a
table and one JSON line; saves the JSON under benchmarks/results/.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from datetime import date
from pathlib import Path

import torch

from interlock.benchmarks.common import load_average, median, print_json_last, print_table
from interlock.kernels import native

CSRC = Path(__file__).resolve().parent.parent / "kernels" / "csrc"
RESULTS = Path(__file__).resolve().parent / "results"
GEMV_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
LAYERS, HKV, H, D, BLOCK = 30, 3, 9, 64, 16


def _renamed(text: str, ns: str, functions: tuple[str, ...]) -> str:
    """One kernel header in namespace `ns` (its helpers renamed too, or argument-dependent lookup
    would find this checkout's overloads beside them)."""
    text = text.replace("#pragma once", "").replace("namespace interlock_cpu {", f"namespace {ns} {{\nusing namespace interlock_cpu;", 1)
    text = re.sub(r"}\s*// namespace interlock_cpu", f"}}  // namespace {ns}", text)
    for name in functions:
        text = re.sub(rf"\b{name}([<(])", rf"{ns}_{name}\1", text)
    return text


def _source(base: str, build: Path) -> Path:
    versions = {"a": subprocess.run(["git", "show", f"{base}:kernels/csrc/int8_linear.h"], cwd=CSRC, check=True,
                                    capture_output=True, text=True).stdout,
                "b": (CSRC / "int8_linear.h").read_text()}
    attention = {"a": subprocess.run(["git", "show", f"{base}:kernels/csrc/attention.h"], cwd=CSRC, check=True,
                                     capture_output=True, text=True).stdout,
                 "b": (CSRC / "attention.h").read_text()}
    parts = ['#include <torch/extension.h>', '#include <chrono>', '#include "int8_linear.h"', '#include "attention.h"']
    for v in "ab":
        parts.append(_renamed(versions[v], f"lin_{v}", ("block", "rows", "step", "out_blocks")))
        # attention.h's functions take plain pointers and its own SeqRows: a namespace of its own is enough.
        att = attention[v].replace("#pragma once", "").replace("namespace interlock_cpu {", f"namespace att_{v} {{", 1)
        parts.append(re.sub(r"}\s*// namespace interlock_cpu", f"}}  // namespace att_{v}", att))
    parts.append("""
using Clock = std::chrono::steady_clock;
double gemv(std::vector<at::Tensor> ws, std::vector<at::Tensor> scales, int64_t v, int64_t M) {
  std::vector<float> x(M * 1536), y(M * 49152);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37 * i);
  const auto t0 = Clock::now();
  for (size_t j = 0; j < ws.size(); ++j) {
    const int64_t N = ws[j].size(0), K = ws[j].size(1);
    auto f = v == 0 ? lin_a::int8_linear_raw : lin_b::int8_linear_raw;
    f(x.data(), ws[j].data_ptr<int8_t>(), scales[j].data_ptr<float>(), y.data(), M, K, N);
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
template <class Seq, class T, class F>
double attention_with(at::Tensor k, at::Tensor v, at::Tensor w, int64_t M, int64_t context, F&& attend) {
  const int64_t slots = k.size(1), per = slots * 3 * 64, wb = w.numel() / 30;
  std::vector<float> q(M * 9 * 64, 0.1f), out(M * 9 * 64);
  std::vector<int64_t> table(slots / 16), sink(64);
  for (size_t i = 0; i < table.size(); ++i) table[i] = i;
  const int8_t* wp = w.data_ptr<int8_t>();
  const T* kb = reinterpret_cast<const T*>(k.data_ptr());
  const T* vb = reinterpret_cast<const T*>(v.data_ptr());
  double timed = 0;
  for (int64_t l = 0; l < 30; ++l) {
    const std::vector<Seq> seqs{Seq{q.data(), 9 * 64, M, context, table.data(), out.data(), 9 * 64}};
    const auto t0 = Clock::now();
    attend(seqs, kb + l * per, vb + l * per);
    timed += std::chrono::duration<double>(Clock::now() - t0).count();
    at::parallel_for(0, wb / 64, 256, [&](int64_t i0, int64_t i1) {      // the step's weights, untimed
      __m512i s = _mm512_setzero_si512();
      for (int64_t i = i0; i < i1; ++i) s = _mm512_add_epi64(s, _mm512_loadu_si512(wp + l * wb + i * 64));
      sink[at::get_thread_num() * 8] += _mm512_reduce_add_epi64(s);
    });
  }
  return timed;
}
template <class T>
double attention_t(at::Tensor k, at::Tensor v, at::Tensor w, int64_t which, int64_t M, int64_t context) {
  if (which == 0)
    return attention_with<att_a::SeqRows, T>(k, v, w, M, context, [](const auto& s, const T* kp, const T* vp) {
      att_a::attend_rows(s, 9, 64, kp, vp, 3, 16, 0.125f); });
  return attention_with<att_b::SeqRows, T>(k, v, w, M, context, [](const auto& s, const T* kp, const T* vp) {
    att_b::attend_rows(s, 9, 64, kp, vp, 3, 16, 0.125f); });
}
double attention(at::Tensor k, at::Tensor v, at::Tensor w, int64_t which, int64_t M, int64_t context) {
  if (k.scalar_type() == at::kHalf) return attention_t<c10::Half>(k, v, w, which, M, context);
  if (k.scalar_type() == at::kBFloat16) return attention_t<c10::BFloat16>(k, v, w, which, M, context);
  return attention_t<float>(k, v, w, which, M, context);
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("gemv", &gemv); m.def("attention", &attention); }
""")
    path = build / "kernel_ab.cpp"
    path.write_text("\n".join(parts))
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the git revision whose kernels to compare with this checkout's")
    p.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8])
    p.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=[200, 1000])
    p.add_argument("--repeats", type=int, default=30, help="alternating runs of each version (medians)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (the engine's model lane: 2)")
    p.add_argument("--kv-dtype", choices=["float32", "float16", "bfloat16"], default="float16",
                   help="the KV cache type the attention reads (the loader's default beside int8 weights: float16)")
    p.add_argument("--out", default=None, help="result JSON (default benchmarks/results/kernel-ab-DATE.json)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from torch.utils.cpp_extension import load

    found = subprocess.run(["git", "rev-parse", "--short", "--verify", f"{args.base}^{{commit}}"], cwd=CSRC,
                           capture_output=True, text=True)
    if found.returncode != 0:
        p.error(f"--base {args.base!r} is not a commit of this checkout's git history")
    base = found.stdout.strip()
    build = Path(tempfile.mkdtemp(prefix="kernel_ab_"))
    ext = load(name=f"interlock_kernel_ab_{base}", sources=[str(_source(base, build))],
               extra_include_paths=[str(CSRC)], extra_cflags=native.CFLAGS,
               extra_ldflags=native.LDFLAGS, build_directory=str(build))
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randint(-127, 128, s, generator=gen, dtype=torch.int8) for s in GEMV_SHAPES]
    scales = [torch.rand(s[0], generator=gen) for s in GEMV_SHAPES]
    load_before = load_average()

    def alternate(fn) -> tuple[float, float]:
        times: dict[int, list[float]] = {0: [], 1: []}
        for _ in range(args.repeats):
            for v in (0, 1):
                times[v].append(fn(v) * 1e3)
        return median(times[0]), median(times[1])

    rows = []
    for m in args.rows:
        a, b = alternate(lambda v: ext.gemv(weights, scales, v, m))
        rows.append({"what": "gemv", "rows": m, "context": None, "base_ms": round(a, 3), "now_ms": round(b, 3),
                     "base_over_now": round(a / b, 2)})
    flat = torch.randint(-127, 128, (sum(n * k for n, k in GEMV_SHAPES[:-1]),), generator=gen, dtype=torch.int8)
    for context in args.contexts:
        for m in args.rows:
            slots = -(-(context + m) // BLOCK) * BLOCK
            k = torch.randn(LAYERS, slots, HKV, D, generator=gen).to(getattr(torch, args.kv_dtype))
            v = torch.randn(LAYERS, slots, HKV, D, generator=gen).to(getattr(torch, args.kv_dtype))
            a, b = alternate(lambda which: ext.attention(k, v, flat, which, m, context))
            rows.append({"what": "attention", "rows": m, "context": context, "base_ms": round(a, 3),
                         "now_ms": round(b, 3), "base_over_now": round(a / b, 2)})
    result = {"base": base, "threads": args.threads, "repeats": args.repeats, "kv_dtype": args.kv_dtype,
              "int8_kernel": native.int8_kernel(),
              "load_average_before": load_before, "load_average_after": load_average(), "rows": rows}
    out = Path(args.out) if args.out else RESULTS / f"kernel-ab-{date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    keys = list(rows[0])
    print_table(f"kernels of {base} vs this checkout, interleaved, {args.threads} thread(s), median of {args.repeats}",
                keys, [[r[k] for k in keys] for r in rows])
    print_json_last({**result, "saved": str(out)})


if __name__ == "__main__":
    main()
