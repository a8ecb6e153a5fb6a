"""Batch-1 greedy prefill and decode speed: our forward (int8 and float weights) vs HF `generate`,
and the forward's step costs against the weight-streaming floor (benchmarks/step_costs.py).

    .venv/bin/python -m interlock.benchmarks.model_speed --tokens 64 --repeats 5

Threads default to the engine's model lane (engine.lane_threads: 2 on a machine with 2+ cores).
Saves the JSON (with the generated token ids) under benchmarks/results/model-speed-<date>.json.

All three runners see the same process settings (torch threads, fp32 activations for the
references), the same chat prompt and the same number of new tokens, and run interleaved
repeat by repeat so that load from other processes on a shared machine hits them alike.

Definitions (N = --tokens new tokens, P = prompt tokens):
- prefill tok/s = P / time of one forward over the prompt (KV written, last-row logits);
- decode tok/s  = (N - 1) / decode time: the prefill already yields the first new token, the
  N - 1 one-token steps after it are the decode. Decode time = median(prefill + decode total)
  - median(prefill) over the repeats; for HF the total is one `generate(N)` call, so HF's
  per-step overhead (logits processors, stopping criteria) counts as decode, just as our
  loop's batch building counts in ours. Medians before the subtraction keep one slow prefill
  on a loaded machine from producing an absurd rate.
- HF step decode tok/s (a cross-check that needs no subtraction): (N - 1) / time between the
  first and the last call of a timestamping logits processor inside the same `generate`.
- load_s = the second `load_model` call of the embedded model (the first one may convert the
  GGUF and fill the on-disk weight cache).

The last line printed is a JSON object (see `main`).
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import torch

from interlock.benchmarks import step_costs
from interlock.benchmarks.common import load_average, median, oversubscribed, print_json_last, print_table, timed
from interlock.engine import lane_threads
from interlock.models.batch import SeqChunk, build_batch
from interlock.models.kv_cache import PagedKVCache
from interlock.models.llama import Transformer
from interlock.models.loader import EMBEDDED, embedded_gguf_path, load_model
from interlock.protocol.types import TokenId

RESULTS = Path(__file__).resolve().parent / "results"
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant. Answer in JSON."},
    {"role": "user", "content": "Describe a fictional person: give their name, age, city, "
                                "two hobbies and whether they own a car."},
]


@dataclass(frozen=True)
class Run:
    """One timed generation: prefill seconds, prefill + N - 1 decode steps seconds, the N new tokens.

    step_decode_s: the N - 1 decode steps timed from inside the loop (ours: same as total - prefill).
    """

    prefill_s: float
    total_s: float
    tokens: tuple[TokenId, ...]
    step_decode_s: float


@dataclass(frozen=True)
class Summary:
    name: str
    prefill_tok_s: float
    decode_tok_s: float
    step_decode_tok_s: float
    tokens: tuple[TokenId, ...]


# --- ours --------------------------------------------------------------------------------------

def run_ours(model: Transformer, prompt: Sequence[TokenId], n: int) -> Run:
    """Prefill as one chunk, then n - 1 single-token steps, each timed as a whole (batch build incl.)."""
    kv = PagedKVCache(model.config, num_blocks=-(-(len(prompt) + n) // 16), block_size=16)
    kv.add_sequence(0)

    def prefill() -> torch.Tensor:
        start = kv.reserve(0, len(prompt))
        return model(build_batch([SeqChunk(0, tuple(prompt), start, (len(prompt) - 1,))], kv), kv)

    def decode(first: TokenId) -> list[TokenId]:
        out = [first]
        for _ in range(n - 1):
            start = kv.reserve(0, 1)
            logits = model(build_batch([SeqChunk(0, (out[-1],), start, (0,))], kv), kv)
            out.append(int(torch.argmax(logits[-1])))
        return out

    logits, prefill_s = timed(prefill)
    tokens, decode_s = timed(lambda: decode(int(torch.argmax(logits[-1]))))
    return Run(prefill_s, prefill_s + decode_s, tuple(tokens), decode_s)


# --- HF transformers ---------------------------------------------------------------------------

def load_hf() -> torch.nn.Module:
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()        # keep the table readable (GGUF conversion chatter)
    path = embedded_gguf_path()
    return LlamaForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def _stamper() -> tuple[Callable[..., torch.Tensor], list[float]]:
    """A logits processor that records when it is called (once per forward, after the forward)."""
    from transformers import LogitsProcessor

    stamps: list[float] = []

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            stamps.append(time.perf_counter())
            return scores

    return Stamp(), stamps


def run_hf(model: torch.nn.Module, prompt: Sequence[TokenId], n: int) -> Run:
    """Prefill: one forward over the prompt with a cache. Total: one generate(n) call."""
    from transformers import LogitsProcessorList

    ids = torch.tensor([list(prompt)])
    mask = torch.ones_like(ids)
    stamp, stamps = _stamper()
    with torch.inference_mode():
        _, prefill_s = timed(lambda: model(input_ids=ids, attention_mask=mask, use_cache=True))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")        # generation-config sampling knobs vs do_sample=False
            out, total_s = timed(lambda: model.generate(
                ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                eos_token_id=None, pad_token_id=0, logits_processor=LogitsProcessorList([stamp])))
    if len(stamps) != n:
        raise RuntimeError(f"expected {n} logits-processor calls inside generate, saw {len(stamps)}")
    return Run(prefill_s, total_s, tuple(out[0, len(prompt):].tolist()), stamps[-1] - stamps[0])


# --- driver ------------------------------------------------------------------------------------

def summarize(name: str, runs: Sequence[Run], prompt_len: int, n: int) -> Summary:
    prefill_s = median([r.prefill_s for r in runs])
    decode_s = median([r.total_s for r in runs]) - prefill_s
    return Summary(name,
                   prefill_tok_s=prompt_len / prefill_s,
                   decode_tok_s=(n - 1) / decode_s if decode_s > 0 else math.nan,
                   step_decode_tok_s=(n - 1) / median([r.step_decode_s for r in runs]),
                   tokens=runs[-1].tokens)


def agree_prefix(a: Sequence[TokenId], b: Sequence[TokenId]) -> int:
    """How many leading tokens two greedy outputs share (a sanity check, not a speed number)."""
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def measure(runners: dict[str, Callable[[], Run]], warmup: int, repeats: int) -> dict[str, list[Run]]:
    """Warm every runner, then interleave repeats so background load is shared fairly."""
    for _ in range(warmup):
        for fn in runners.values():
            fn()
    runs: dict[str, list[Run]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, fn in runners.items():
            gc.collect()
            runs[name].append(fn())
    return runs


def _fmt_load(load: tuple[float, float, float] | None) -> str:
    return "n/a" if load is None else "/".join(f"{x:.2f}" for x in load)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=64, help="new tokens per generation (N >= 2)")
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions per runner (medians reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per runner first")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads, for all (default: the engine's model-lane setting)")
    p.add_argument("--contexts", type=int, nargs="*", default=[200, 1000],
                   help="context lengths for the step costs (none: skip them)")
    p.add_argument("--step-repeats", type=int, default=20, help="timed repeats per step cost (medians)")
    p.add_argument("--kv-dtypes", default="",
                   help="KV cache types to time the step costs with, each context in turn (comma-separated; "
                        "default: the loader's own, float16 beside int8 weights)")
    p.add_argument("--out", type=Path, default=None, help="where to save the JSON (default: benchmarks/results/)")
    p.add_argument("--json-only", action="store_true", help="print only the JSON line")
    args = p.parse_args(argv)
    if (args.tokens < 2 or args.repeats < 1 or args.warmup < 0 or (args.threads is not None and args.threads < 1) or args.step_repeats < 1
            or any(c < 1 for c in args.contexts)):
        p.error("need --tokens >= 2, --repeats >= 1, --warmup >= 0, --threads >= 1, --step-repeats >= 1, "
                "--contexts >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads is None:
        torch.set_num_threads(1)            # as an engine's owner thread would, so the lane gets its share
        args.threads = lane_threads(None)
    torch.set_num_threads(args.threads)
    load_before = load_average()
    busy = oversubscribed(args.threads)
    first = [load_model(EMBEDDED, weights=w) for w in ("int8", "int4")]     # may convert the GGUF once
    int8, int4 = (load_model(EMBEDDED, weights=w) for w in ("int8", "int4"))  # the loads users see: cached
    del first
    gc.collect()
    # Step costs first, with only the quantized models in memory: the float and HF copies (~1 GB)
    # loaded beside them were measured to slow the steps by ~30% (cache and memory pressure).
    kv_dtypes = [d for d in args.kv_dtypes.split(",") if d] or [None]
    costs = [(name, step_costs.measure(m.model, ctx, args.step_repeats, kv_dtype))
             for ctx in args.contexts for kv_dtype in kv_dtypes for name, m in (("int8", int8), ("int4", int4))]
    flt = load_model(EMBEDDED, weights="float")
    hf, hf_load_s = timed(load_hf)
    prompt = int8.tokenizer.encode_prompt(MESSAGES)
    n = args.tokens
    runs = measure({
        "ours int8": lambda: run_ours(int8.model, prompt, n),
        "ours int4": lambda: run_ours(int4.model, prompt, n),
        "ours float": lambda: run_ours(flt.model, prompt, n),
        "HF generate": lambda: run_hf(hf, prompt, n),
    }, args.warmup, args.repeats)
    s = {name: summarize(name, r, len(prompt), n) for name, r in runs.items()}
    load_after = load_average()
    ours, ours4, ref, hfs = s["ours int8"], s["ours int4"], s["ours float"], s["HF generate"]
    result = {
        "threads": args.threads, "prompt_tokens": len(prompt), "new_tokens": n, "repeats": args.repeats,
        "ours_decode_tok_s": ours.decode_tok_s, "ours_prefill_tok_s": ours.prefill_tok_s,
        "ours_int4_decode_tok_s": ours4.decode_tok_s, "ours_int4_prefill_tok_s": ours4.prefill_tok_s,
        "int4_over_int8_decode": ours4.decode_tok_s / ours.decode_tok_s,
        "ours_float_decode_tok_s": ref.decode_tok_s, "ours_float_prefill_tok_s": ref.prefill_tok_s,
        "hf_decode_tok_s": hfs.decode_tok_s, "hf_prefill_tok_s": hfs.prefill_tok_s,
        "hf_step_decode_tok_s": hfs.step_decode_tok_s,
        "step_decode_ratio": ours.step_decode_tok_s / hfs.step_decode_tok_s,
        "decode_ratio": ours.decode_tok_s / hfs.decode_tok_s,
        "float_decode_ratio": ref.decode_tok_s / hfs.decode_tok_s,
        "prefill_ratio": ours.prefill_tok_s / hfs.prefill_tok_s,
        "load_s": int8.load_s, "hf_load_s": hf_load_s,
        "float_agrees_with_hf": agree_prefix(ref.tokens, hfs.tokens),
        "int8_agrees_with_hf": agree_prefix(ours.tokens, hfs.tokens),
        "int4_agrees_with_hf": agree_prefix(ours4.tokens, hfs.tokens),
        "step_costs": [{"weights": w} | dataclasses.asdict(c) | {"decode_over_floor": c.decode_over_floor,
                                                                  "verify4_over_decode": c.verify4_over_decode}
                       for w, c in costs],
        "tokens": {x.name: list(x.tokens) for x in (ours, ours4, ref, hfs)},
        "oversubscribed": busy,
        "loadavg_before": load_before[0] if load_before else None,
        "loadavg_after": load_after[0] if load_after else None,
    }
    if not args.json_only:
        print_table(
            f"batch-1 greedy, {len(prompt)}-token prompt, {n} new tokens, {args.threads} threads, "
            f"median of {args.repeats}",
            ["runner", "prefill tok/s", "decode tok/s", "decode vs HF", "in-loop decode tok/s",
             "tokens = HF (prefix)"],
            [[x.name, x.prefill_tok_s, x.decode_tok_s, x.decode_tok_s / hfs.decode_tok_s, x.step_decode_tok_s,
              f"{agree_prefix(x.tokens, hfs.tokens)}/{n}"] for x in (ours, ours4, ref, hfs)])
        if costs:
            print_table(
                f"forward step costs, {args.threads} threads, median of {args.step_repeats} "
                "(floor: reading every weight the kernels read once)",
                ["weights", "context", "KV cache", "floor ms", "decode ms", "decode / floor", "4-row verify ms",
                 "verify / decode", "prefill tok/s"],
                [[w, c.context, c.kv_dtype, c.floor_ms, c.decode_ms, c.decode_over_floor, c.verify4_ms,
                  c.verify4_over_decode, c.prefill_tok_s] for w, c in costs])
        print(f"load_s (2nd load, int8) {int8.load_s:.2f} s; HF load {hf_load_s:.2f} s; "
              f"load average {_fmt_load(load_before)} -> {_fmt_load(load_after)}")
        if busy:
            print(f"warning: load average + {args.threads} threads exceed the {os.cpu_count()} cores: "
                  "timings include waiting for a core" + ("; compare with --threads 1" if args.threads > 1 else ""))
    out = args.out or RESULTS / f"model-speed-{date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    if not args.json_only:
        print(f"saved {out}")
    print_json_last({k: v for k, v in result.items() if k != "tokens"})


if __name__ == "__main__":
    main(sys.argv[1:])
