"""`python -m interlock.benchmarks.kernel_quality`: what the int8 decode kernels cost in quality.

The embedded model's weights are bf16 in the GGUF; `weights="float"` runs them unquantized (fp32
arithmetic) and is the reference. On JSONSchemaBench prompts (benchmarks/prompts.py) the
reference writes a greedy continuation of --tokens tokens; then every model reads prompt +
continuation, the continuation as decode/verify rows (chunks of ROW_PATH_MAX_TOKENS, the rows
path a decode step takes), and we compare each position's next-token distribution with the
reference's:

- int8 native: int8 weights, activations quantized to int8 in blocks of 32 (what the engine runs
  where the native kernels build: kernels/csrc/int8_linear.h, int8_amx.h);
- int8 native, bf16 prefill: the same, with the prompt prefilled by the dense path's bf16 GEMMs
  (`prefill="dense"`; the default where the CPU has neither AMX nor AVX512-VNNI);
- int8 torch:  int8 weights, bf16 activations (torch's `_weight_int8pack_mm`, the fallback);
- int8 native, <dtype> KV: int8 native with the KV cache in fp16 or bf16 (--kv-dtypes).

Reports top-1 agreement with the reference, mean and max KL(reference || model) in nats, and
how many greedy continuations the model reproduces token for token. Saves the JSON (token ids
included) under benchmarks/results/.
"""
from __future__ import annotations

import argparse
import json
from datetime import date
from pathlib import Path

import torch

from interlock.benchmarks.common import print_json_last, print_table
from interlock.benchmarks.prompts import build_messages, dataset_arg, load_rows
from interlock.kernels import native
from interlock.models.batch import ROW_PATH_MAX_TOKENS, SeqChunk, build_batch
from interlock.models.kv_cache import PagedKVCache
from interlock.models.linear import Int8Linear
from interlock.models.llama import Transformer
from interlock.models.loader import EMBEDDED, load_model

RESULTS = Path(__file__).resolve().parent / "results"


def _kv(model: Transformer, tokens: int) -> PagedKVCache:
    kv = PagedKVCache(model.config, num_blocks=-(-tokens // 16) + 1, block_size=16)
    kv.add_sequence(0)
    return kv


def greedy(model: Transformer, prompt: list[int], n: int) -> list[int]:
    kv = _kv(model, len(prompt) + n)
    start = kv.reserve(0, len(prompt))
    logits = model(build_batch([SeqChunk(0, tuple(prompt), start, (len(prompt) - 1,))], kv), kv)[-1]
    out: list[int] = []
    for _ in range(n):
        out.append(int(logits.argmax()))
        start = kv.reserve(0, 1)
        logits = model(build_batch([SeqChunk(0, (out[-1],), start, (0,))], kv), kv)[-1]
    return out


def log_probs(model: Transformer, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """[len(continuation), V] next-token log-probabilities before each continuation token."""
    kv = _kv(model, len(prompt) + len(continuation))
    start = kv.reserve(0, len(prompt))
    rows = [model(build_batch([SeqChunk(0, tuple(prompt), start, (len(prompt) - 1,))], kv), kv)]
    feed = continuation[:-1]
    for i in range(0, len(feed), ROW_PATH_MAX_TOKENS):
        part = tuple(feed[i: i + ROW_PATH_MAX_TOKENS])
        start = kv.reserve(0, len(part))
        rows.append(model(build_batch([SeqChunk(0, part, start, tuple(range(len(part))))], kv), kv))
    return torch.cat(rows).double().log_softmax(-1)


def torch_int8(model: Transformer) -> Transformer:
    """The same model with every int8 projection on torch's kernel (bf16 activations)."""
    # The layers' projections sit in plain dicts (model._linears), not registered submodules.
    linears = [lin for layer in model._linears for lin in layer.values()] + list(model.modules())
    for module in linears:
        if isinstance(module, Int8Linear):
            module.native = False
    model.fused_rows = None
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", type=dataset_arg, default="JME", help="a JSONSchemaBench set (name or .jsonl path)")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kv-dtypes", default="float16,bfloat16",
                   help="KV cache types to run int8 native with besides float32 (comma-separated; '' for none)")
    p.add_argument("--out", default=None, help="result JSON (default benchmarks/results/kernel-quality-DATE.json)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    reference = load_model(EMBEDDED, weights="float")
    dense_prefill = load_model(EMBEDDED).model
    dense_prefill.rows_prefill = False
    models = {"int8 native": load_model(EMBEDDED).model, "int8 native, bf16 prefill": dense_prefill,
              "int8 torch": torch_int8(load_model(EMBEDDED).model)}
    for kv_dtype in filter(None, args.kv_dtypes.split(",")):
        models[f"int8 native, {kv_dtype} KV"] = load_model(EMBEDDED, kv_dtype=kv_dtype).model
    tokenizer = reference.tokenizer
    stats = {name: {"agree": 0, "positions": 0, "kl_sum": 0.0, "kl_max": 0.0, "same_greedy": 0} for name in models}
    prompts = []
    for row in load_rows(args.dataset, args.limit):
        prompt = tokenizer.encode_prompt(build_messages(row))
        continuation = greedy(reference.model, prompt, args.tokens)
        ref = log_probs(reference.model, prompt, continuation)
        entry = {"id": row.id, "prompt_ids": prompt, "reference_ids": continuation, "greedy_ids": {}}
        for name, model in models.items():
            lp = log_probs(model, prompt, continuation)
            kl = (ref.exp() * (ref - lp)).sum(-1)
            s = stats[name]
            s["agree"] += int((lp.argmax(-1) == ref.argmax(-1)).sum())
            s["positions"] += len(continuation)
            s["kl_sum"] += float(kl.sum())
            s["kl_max"] = max(s["kl_max"], float(kl.max()))
            own = greedy(model, prompt, args.tokens)
            s["same_greedy"] += own == continuation
            entry["greedy_ids"][name] = own
        prompts.append(entry)

    rows = [{"model": name, "top1_agreement": round(s["agree"] / s["positions"], 4),
             "mean_kl": round(s["kl_sum"] / s["positions"], 5), "max_kl": round(s["kl_max"], 4),
             "same_greedy": f"{s['same_greedy']}/{len(prompts)}"} for name, s in stats.items()]
    result = {"dataset": str(args.dataset), "limit": args.limit, "tokens": args.tokens, "threads": args.threads,
              "int8_kernel": native.int8_kernel(), "rows": rows, "prompts": prompts}
    keys = ["model", "top1_agreement", "mean_kl", "max_kl", "same_greedy"]
    print_table(f"vs the unquantized model ({args.limit} prompts x {args.tokens} tokens, "
                f"int8 kernel: {result['int8_kernel']})", keys,
                [[f"{r[k]:.5f}" if isinstance(r[k], float) else r[k] for k in keys] for r in rows])
    out = Path(args.out) if args.out else RESULTS / f"kernel-quality-{date.today().isoformat()}.json"
    out.write_text(json.dumps(result))
    print_json_last({k: v for k, v in result.items() if k != "prompts"} | {"saved": str(out)})


if __name__ == "__main__":
    main()
