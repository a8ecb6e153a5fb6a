"""Peers side by side, one process, one run: interlock's modes, HF transformers + xgrammar, llama.cpp.

    python -m interlock.benchmarks.peers --workload jme --limit 20
    python -m interlock.benchmarks.peers --workload repeated --limit 50 --modes none,ngram+forced,suffix+forced
    python -m interlock.benchmarks.peers --workload extraction --limit 8 --prefix-caching both --dense-dtype auto,bf16
    python -m interlock.benchmarks.peers --workload extraction-tail --limit 4 --prefix-caching both

Every system gets the same chat prompts (benchmarks/prompts.py; `repeated`: one schema, many
documents, benchmarks/workloads.py), greedy decoding, the same max_tokens and the schema as its
grammar:
- interlock: one Engine per mode (`--modes`, as `--speculative` takes them), requests one at a time;
- HF transformers `generate` (fp32 weights from the same GGUF) with xgrammar's mask through
  `RollbackGrammarProcessor`, plain and with prompt lookup (`prompt_lookup_num_tokens`). xgrammar's
  own HF processor only moves forward, so it breaks under assisted generation, which calls the
  processor for each candidate prefix and then continues from a shorter one: this one rolls back;
- llama.cpp through llama-cpp-python (the `[peers]` extra; skipped when not importable), with its
  JSON-schema grammar, plain and with its prompt-lookup drafter. llama-cpp-python 0.3.36's
  prompt-lookup path fails on these prompts (ValueError in `Llama.eval`: its logits buffer
  overflows), and a build with ggml's AMX backend segfaults on this CPU: build the wheel with
  `CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"`. A peer that raises is reported
  under "failures" in the saved file; the others keep their results.

Timing: one warm-up request per system, then every prompt `--repeats` times; a prompt's figures are
the medians over its repeats. End to end = output tokens / (submit -> last token); decode = (output
tokens - 1) / (first token -> last token); TTFT = submit -> first token. The table's ratios divide by
interlock's best end-to-end mode. "valid": outputs the schema accepts; "exact": outputs that are
the record the prompt states, value for value (a measure of the extraction, not of the decoding:
greedy outputs may differ between systems whose arithmetic differs); "acceptance": interlock's
tokens per verify step. Raw results (token ids, text, validity, times per repeat) go to
benchmarks/results/peers-<workload>-<date>.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from interlock.benchmarks.common import load_average, percentile, print_json_last, print_table
from interlock.benchmarks.prompts import Row, build_messages, build_prompt, dataset_arg, is_valid, load_rows
from interlock.benchmarks.workloads import REPEATED_ROW, extraction, repeated_schema, row_by_id
from interlock.logs import configure_logging
from interlock.models.names import EMBEDDED

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Sample:
    """One request: its output and when its tokens arrived (seconds after submit)."""

    token_ids: tuple[int, ...]
    text: str
    ttft_s: float
    total_s: float
    valid: bool
    steps: int = 0              # interlock: verify steps that produced this output's tokens
    step_tokens: int = 0        # and the tokens they produced (acceptance = step_tokens / steps)


Runner = Callable[[Row], Sample]


def is_exact(text: str, row: Row) -> bool:
    """The output is the record the prompt's facts describe (its first valid instance), value for value."""
    try:
        return bool(row.valid_instances) and json.loads(text) == row.valid_instances[0].data
    except ValueError:
        return False


# --- HF transformers + xgrammar -----------------------------------------------------------------

class RollbackGrammarProcessor:
    """An HF logits processor applying xgrammar's mask after whatever prefix generate shows it.

    It keeps the tokens its matcher has accepted; a call whose prefix diverges from them rolls the
    matcher back to the common prefix first (assisted generation verifies candidates, then goes on
    from the accepted ones). A prefix holding a token the grammar refuses (a rejected candidate) or
    one past the stop token is left unmasked: generate discards that row.
    """

    def __init__(self, compiled: Any, prompt_len: int, vocab_size: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.prompt_len = prompt_len
        self.accepted: list[int] = []
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        ids = input_ids[0, self.prompt_len:].tolist()
        common = 0
        while common < min(len(ids), len(self.accepted)) and ids[common] == self.accepted[common]:
            common += 1
        if len(self.accepted) > common:
            self.matcher.rollback(len(self.accepted) - common)
            del self.accepted[common:]
        for t in ids[common:]:
            if not self.matcher.accept_token(t):
                return scores
            self.accepted.append(t)
        if self.matcher.is_terminated():
            return scores                               # after a stop token: generate stops there
        self.matcher.fill_next_token_bitmask(self.bitmask)
        self.xgr.apply_token_bitmask_inplace(scores, self.bitmask)
        return scores


class Stamps:
    """A generate streamer that only notes when tokens arrive (the first `put` is the prompt).

    Timestamps from a logits processor would be wrong under prompt lookup: the candidate generator
    runs the processors before the first forward."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        return None


def hf_runner(max_tokens: int, lookup: int) -> Runner:
    import xgrammar as xgr
    from transformers import LogitsProcessorList

    from interlock.benchmarks.model_speed import load_hf
    from interlock.models.loader import load_tokenizer
    from interlock.protocol.grammar import JsonSchema

    model = load_hf()
    tok = load_tokenizer(EMBEDDED)
    vocab = model.config.vocab_size
    info = xgr.TokenizerInfo.from_huggingface(tok.hf, vocab_size=vocab, stop_token_ids=list(tok.eos_token_ids))
    compiler = xgr.GrammarCompiler(info)

    def run(row: Row) -> Sample:
        prompt = tok.encode_prompt(build_messages(row))
        # The grammar interlock compiles for the same request: closed objects, no optional whitespace.
        compiled = compiler.compile_json_schema(JsonSchema(row.schema).compiled_schema, any_whitespace=False,
                                                separators=(",", ":"), strict_mode=False)
        stamps = Stamps()
        ids = torch.tensor([prompt])
        extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                                 eos_token_id=list(tok.eos_token_ids), pad_token_id=tok.eos_token_ids[0],
                                 logits_processor=LogitsProcessorList(
                                     [RollbackGrammarProcessor(compiled, len(prompt), vocab)]),
                                 streamer=stamps, **extra)
        end = time.perf_counter()
        new = [t for t in out[0, len(prompt):].tolist() if t not in tok.eos_token_ids]
        text = tok.decode(new)
        first = stamps.times[1] if len(stamps.times) > 1 else end   # put #0 is the prompt itself
        return Sample(tuple(new), text, first - start, end - start, is_valid(text, row.schema))

    return run


# --- llama.cpp ------------------------------------------------------------------------------------

def llama_cpp_runner(max_tokens: int, lookup: int, threads: int, model: str | None = None) -> Runner | None:
    """model: a GGUF path (None: the embedded SmolLM2)."""
    try:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError:
        return None
    from interlock.models.loader import embedded_gguf_path

    draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup) if lookup else None
    llm = Llama(model_path=model or str(embedded_gguf_path()), n_ctx=4096, n_threads=threads, verbose=False,
                draft_model=draft)

    def run(row: Row) -> Sample:
        start, first, parts = time.perf_counter(), 0.0, []
        for chunk in llm.create_chat_completion(
                build_messages(row), temperature=0.0, max_tokens=max_tokens, stream=True,
                response_format={"type": "json_object", "schema": row.schema}):
            piece = chunk["choices"][0]["delta"].get("content")
            if piece:
                first = first or time.perf_counter()
                parts.append(piece)
        end = time.perf_counter()
        text = "".join(parts)
        ids = tuple(llm.tokenize(text.encode(), add_bos=False, special=False))
        return Sample(ids, text, (first or end) - start, end - start, is_valid(text, row.schema))

    return run


# --- interlock -----------------------------------------------------------------------------------

def measure_interlock(mode: str, rows: Sequence[Row], repeats: int, max_tokens: int,
                      prefix_caching: bool = True, threads: int = 1, prefill: str = "auto",
                      model: str = EMBEDDED, dense: str = "auto",
                      kv_dtype: str = "auto") -> dict[str, Any]:
    """Like `measure`, inside one event loop: an engine is entered and left by one task."""
    import anyio

    from interlock.engine import Engine
    from interlock.protocol.grammar import JsonSchema
    from interlock.protocol.sampling import SamplingParams

    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)

    async def one(engine: Engine, row: Row) -> Sample:
        start, first, ids, text, stats = time.perf_counter(), 0.0, [], [], None
        async for delta in engine.generate(build_prompt(row, engine.tokenizer), grammar=JsonSchema(row.schema), sampling=sampling):
            if delta.token_ids and not first:
                first = time.perf_counter()
            ids.extend(delta.token_ids)
            text.append(delta.text)
            stats = delta.stats or stats
        end = time.perf_counter()
        out = "".join(text)
        return Sample(tuple(ids), out, (first or end) - start, end - start, is_valid(out, row.schema),
                      stats.steps if stats else 0, stats.step_tokens if stats else 0)

    async def collect() -> list[list[Sample]]:
        engine = Engine.from_pretrained(model, speculative=mode, prefix_caching=prefix_caching, threads=threads,
                                        prefill=prefill, kv_dtype=None if kv_dtype == "auto" else kv_dtype)
        if dense != "auto":             # the prompt GEMMs' dtype (models/linear.py dense_dtype): A/B of the old path
            engine.model.model.set_dense_dtype({"bf16": torch.bfloat16, "fp32": torch.float32}[dense])
        async with engine:
            await one(engine, rows[0])                  # warm-up
            return [[await one(engine, row) for _ in range(repeats)] for row in rows]

    label = (f"interlock {mode}" + ("" if prefix_caching else " (no prefix cache)")
             + ("" if prefill == "auto" else f" ({prefill} prefill)")
             + ("" if dense == "auto" else f" ({dense} prompt GEMMs)")
             + ("" if kv_dtype == "auto" else f" ({kv_dtype} KV cache)"))
    return summarize(label, rows, anyio.run(collect))


# --- driver ----------------------------------------------------------------------------------------

def measure(name: str, runner: Runner, rows: Sequence[Row], repeats: int) -> dict[str, Any]:
    runner(rows[0])                                     # warm-up (compiles, caches, first-call costs)
    return summarize(name, rows, [[runner(row) for _ in range(repeats)] for row in rows])


def summarize(name: str, rows: Sequence[Row], samples: list[list[Sample]]) -> dict[str, Any]:
    """Medians per prompt over its repeats, then totals (see the module docstring)."""
    per_prompt = [{"row": row.id, "samples": [asdict(s) for s in ss]} for row, ss in zip(rows, samples)]
    med = [{k: statistics.median(s[k] for s in p["samples"]) for k in ("ttft_s", "total_s")} |
           {"n": len(p["samples"][0]["token_ids"]), "valid": p["samples"][0]["valid"],
            "exact": is_exact(p["samples"][0]["text"], row)} for p, row in zip(per_prompt, rows)]
    tokens = sum(m["n"] for m in med)
    steps = sum(p["samples"][0]["steps"] for p in per_prompt)
    total = sum(m["total_s"] for m in med)
    decode = sum(m["total_s"] - m["ttft_s"] for m in med)
    return {"system": name, "tokens": tokens, "e2e_tok_s": tokens / total if total else 0.0,
            "decode_tok_s": (tokens - len(med)) / decode if decode else 0.0,
            "ttft_p50_s": percentile([m["ttft_s"] for m in med], 50),
            "mean_acceptance_length": (sum(p["samples"][0]["step_tokens"] for p in per_prompt) / steps
                                       if steps else None),
            "valid": sum(m["valid"] for m in med), "exact": sum(m["exact"] for m in med), "prompts": len(med),
            "per_prompt": per_prompt}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", choices=["jme", "repeated", "extraction", "extraction-tail"], default="jme",
                   help="extraction: --row's schema over --limit documents of 500-2,000 tokens; extraction-tail: "
                        "one 2,000-token document, a different last paragraph each (workloads.py)")
    p.add_argument("--dataset", type=dataset_arg, default="JME", help="a JSONSchemaBench set (name or .jsonl path)")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--row", default=REPEATED_ROW, help="the JME row whose schema the repeated workload uses")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2,
                   help="threads for every system (interlock: its model lane, with the rest of the process at 1 "
                        "until the interlock modes are done: a second OpenMP pool would slow the lane; then HF's)")
    p.add_argument("--modes", default="none,ngram+forced,suffix+forced", help="interlock modes, comma-separated")
    p.add_argument("--peers", default="hf,hf+lookup,llama.cpp,llama.cpp+lookup")
    p.add_argument("--prefix-caching", choices=["on", "off", "both"], default="on",
                   help="interlock's prefix cache; both: each mode with, then without")
    p.add_argument("--prefill", default="auto", help="interlock's prompt path, comma-separated to run each: "
                   "auto, rows, dense (EngineConfig.prefill)")
    p.add_argument("--dense-dtype", default="auto", help="interlock's prompt-GEMM dtype, comma-separated to run "
                   "each: auto (models/linear.py dense_dtype), bf16, fp32")
    p.add_argument("--kv-dtype", default="auto", help="interlock's KV-cache dtype, comma-separated to run each: "
                   "auto (models/loader.py default_kv_dtype), float32, float16, bfloat16")
    p.add_argument("--model", default=None, help="a GGUF both interlock and llama.cpp run (default: the embedded "
                   "SmolLM2; the hf peers always run SmolLM2)")
    p.add_argument("--json", help="where to save the raw results (default benchmarks/results/peers-...)")
    args = p.parse_args(argv)
    configure_logging(level="warning")
    torch.set_num_threads(1)                # interlock's model lane owns its threads; HF gets them below
    rows = (load_rows(args.dataset, args.limit) if args.workload == "jme" else
            repeated_schema(row_by_id(args.dataset, args.row), args.limit) if args.workload == "repeated" else
            extraction(row_by_id(args.dataset, args.row), args.limit, shared_head=args.workload == "extraction-tail"))
    out = Path(args.json) if args.json else RESULTS / f"peers-{args.workload}-{datetime.date.today()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    failures: dict[str, str] = {}

    def save() -> None:         # after every system: a peer that crashes the process loses only itself
        out.write_text(json.dumps({"args": vars(args), "load": load_average(), "results": results,
                                   "failures": failures}, default=str))       # default: the dataset's Path

    caching = {"on": (True,), "off": (False,), "both": (True, False)}[args.prefix_caching]
    for mode in filter(None, args.modes.split(",")):
        for on in caching:
            for prefill in filter(None, args.prefill.split(",")):
                for dense in filter(None, args.dense_dtype.split(",")):
                    for kv in filter(None, args.kv_dtype.split(",")):
                        results.append(measure_interlock(mode, rows, args.repeats, args.max_tokens, on,
                                                         args.threads, prefill,
                                                         args.model or EMBEDDED, dense, kv))
                        save()
    torch.set_num_threads(args.threads)
    for peer in filter(None, args.peers.split(",")):
        lookup = 3 if peer.endswith("+lookup") else 0
        runner = (hf_runner(args.max_tokens, lookup) if peer.startswith("hf") else
                  llama_cpp_runner(args.max_tokens, lookup, args.threads, args.model))
        if runner is None:
            print(f"{peer}: llama-cpp-python is not importable (pip install 'interlock[peers]'); skipped")
            continue
        try:
            results.append(measure(peer, runner, rows, args.repeats))
        except Exception as exc:  # noqa: BLE001 - a peer's own bug: report it, keep the others
            print(f"{peer} failed: {exc!r}")
            failures[peer] = repr(exc)
        save()
    if not any(r["system"].startswith("interlock") for r in results):
        print_json_last({"file": str(out), **{r["system"]: round(r["e2e_tok_s"], 2) for r in results}})
        return
    best = max((r for r in results if r["system"].startswith("interlock")), key=lambda r: r["e2e_tok_s"])
    table = [(r["system"], r["e2e_tok_s"], r["decode_tok_s"], r["ttft_p50_s"],
              "-" if r.get("mean_acceptance_length") is None else round(r["mean_acceptance_length"], 2),
              f"{r['valid']}/{r['prompts']}",
              f"{r['exact']}/{r['prompts']}",
              best["e2e_tok_s"] / r["e2e_tok_s"] if r["e2e_tok_s"] else float("nan")) for r in results]
    print_table(f"peers, {args.workload} x {len(rows)}, greedy, max_tokens {args.max_tokens}, "
                f"{args.threads} thread(s), load {load_average()}",
                ["system", "e2e tok/s", "decode tok/s", "TTFT p50 s", "acceptance", "valid", "exact",
                 f"{best['system']} is x faster"],
                table)
    print_json_last({"file": str(out), **{r["system"]: round(r["e2e_tok_s"], 2) for r in results}})


if __name__ == "__main__":
    main()
