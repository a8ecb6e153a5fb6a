"""Qwen3 on the CPU against llama.cpp, side by side in one run, on one GGUF file:

    python -m interlock.benchmarks.family_speed --tokens 64 --limit 5

1. writes (once) a random-weight GGUF shaped as Qwen3-0.6B (28 layers, hidden 1024, 16 query heads
   x 128 over 8 KV heads, MLP 3072, q/k norms, tied embeddings, a 151,936-row vocabulary), Q8_0
   matrices, llama.cpp's qwen3 layout. Its tokenizer is the embedded SmolLM2's BPE (49,152 tokens,
   ChatML) padded with unreachable placeholder tokens to Qwen3's vocabulary size, so the head, the
   masks and the sampler work at Qwen3's size. No Qwen weights or tokenizer are downloaded;
2. decode: interlock's int8 engine (no speculation, no grammar) and llama.cpp (llama-cpp-python,
   the `[peers]` extra) each generate --tokens tokens after the same prompt, EOS banned; decode
   tok/s = (tokens - 1) / (first token -> last token), the median of --repeats;
3. end to end: benchmarks/peers.py on the same file (JSON-schema generation, JME rows), interlock
   modes `none` and `ngram+forced` against llama.cpp with its JSON-schema grammar.
Results go to benchmarks/results/family-qwen3-<date>.json (and peers.py's file); nothing is asserted.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from interlock.benchmarks.common import load_average
from interlock.logs import configure_logging

RESULTS = Path(__file__).resolve().parent / "results"
SHAPE = {"layers": 28, "hidden": 1024, "heads": 16, "kv_heads": 8, "head_dim": 128, "mlp": 3072,
         "vocab": 151_936, "context": 40_960, "rope_theta": 1_000_000.0, "eps": 1e-6}
PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper and the sea."}]


def write_qwen3_gguf(path: Path, seed: int = 0) -> Path:
    """The random-weight Qwen3-0.6B-shaped GGUF (module docstring)."""
    import gguf
    from gguf import quants
    from gguf.constants import GGMLQuantizationType as Q

    from interlock.models.loader import embedded_gguf_path

    s, rng = SHAPE, np.random.default_rng(seed)
    src = gguf.GGUFReader(str(embedded_gguf_path()))

    def field(name: str) -> Any:
        return src.fields[name].contents()

    tokens = list(field("tokenizer.ggml.tokens"))
    types = list(field("tokenizer.ggml.token_type"))
    pad = s["vocab"] - len(tokens)
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_block_count(s["layers"])
    w.add_context_length(s["context"])
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["mlp"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(s["rope_theta"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_vocab_size(s["vocab"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens + [f"<|placeholder{i}|>" for i in range(pad)])
    w.add_token_types(types + [gguf.TokenType.NORMAL] * pad)
    w.add_token_merges(list(field("tokenizer.ggml.merges")))
    w.add_bos_token_id(int(field("tokenizer.ggml.bos_token_id")))
    w.add_eos_token_id(int(field("tokenizer.ggml.eos_token_id")))
    w.add_chat_template(field("tokenizer.chat_template"))

    def matrix(name: str, rows: int, cols: int, scale: float) -> None:
        data = (rng.standard_normal((rows, cols), dtype=np.float32) * scale).astype(np.float32)
        w.add_tensor(name, quants.quantize(data, Q.Q8_0), raw_dtype=Q.Q8_0)

    def norm(name: str, n: int) -> None:
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    e, d, q, kv = s["hidden"], s["head_dim"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    matrix("token_embd.weight", s["vocab"], e, 0.05)
    norm("output_norm.weight", e)
    for i in range(s["layers"]):
        b = f"blk.{i}."
        norm(b + "attn_norm.weight", e)
        norm(b + "ffn_norm.weight", e)
        norm(b + "attn_q_norm.weight", d)
        norm(b + "attn_k_norm.weight", d)
        matrix(b + "attn_q.weight", q, e, e ** -0.5)
        matrix(b + "attn_k.weight", kv, e, e ** -0.5)
        matrix(b + "attn_v.weight", kv, e, e ** -0.5)
        matrix(b + "attn_output.weight", e, q, q ** -0.5)
        matrix(b + "ffn_gate.weight", s["mlp"], e, e ** -0.5)
        matrix(b + "ffn_up.weight", s["mlp"], e, e ** -0.5)
        matrix(b + "ffn_down.weight", e, s["mlp"], s["mlp"] ** -0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def interlock_decode(path: Path, n: int, repeats: int, threads: int) -> list[float]:
    import anyio

    from interlock.engine import Engine
    from interlock.protocol.sampling import SamplingParams

    async def run() -> list[float]:
        out = []
        async with Engine.from_pretrained(str(path), speculative=None, threads=threads) as engine:
            for _ in range(repeats + 1):                       # the first is a warm-up
                stamps = []
                async for delta in engine.generate(PROMPT, sampling=SamplingParams(temperature=0.0, max_tokens=n,
                                                                                   ignore_eos=True)):
                    stamps.extend([time.perf_counter()] * len(delta.token_ids))
                out.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
        return out[1:]

    return anyio.run(run)


def llama_cpp_decode(path: Path, n: int, repeats: int, threads: int) -> list[float] | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(model_path=str(path), n_ctx=2048, n_threads=threads, verbose=False)
    out = []
    for _ in range(repeats + 1):
        stamps = []
        for _chunk in llm.create_chat_completion(PROMPT, temperature=0.0, max_tokens=n, stream=True,
                                                 logit_bias={llm.token_eos(): -1e9}):
            stamps.append(time.perf_counter())
        stamps = stamps[1:]                                    # the first chunk carries the role, no token
        out.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
    return out[1:]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gguf", default="/tmp/interlock-qwen3-0.6b-random-q8_0.gguf", help="written if missing")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--limit", type=int, default=5, help="JME rows for the end-to-end run (0: skip it)")
    p.add_argument("--json", help="where to save (default benchmarks/results/family-qwen3-<date>.json)")
    args = p.parse_args(argv)
    configure_logging(level="warning")
    path = Path(args.gguf)
    if not path.exists():
        write_qwen3_gguf(path)
    result: dict[str, Any] = {"args": vars(args), "shape": SHAPE, "load_before": load_average()}
    ours = interlock_decode(path, args.tokens, args.repeats, args.threads)
    theirs = llama_cpp_decode(path, args.tokens, args.repeats, args.threads)
    result["decode_tok_s"] = {"interlock int8": ours, "llama.cpp": theirs}
    if theirs:
        result["decode_ratio_interlock_over_llama_cpp"] = statistics.median(ours) / statistics.median(theirs)
    out = Path(args.json) if args.json else RESULTS / f"family-qwen3-{datetime.date.today()}.json"
    out.write_text(json.dumps(result, indent=1))           # the decode figures, kept if the end-to-end run fails
    if args.limit:
        from interlock.benchmarks import peers

        peers_out = out.with_name(out.stem + "-peers.json")
        peers.main(["--model", str(path), "--limit", str(args.limit), "--repeats", "1", "--max-tokens",
                    str(args.tokens), "--modes", "none,ngram+forced", "--peers", "llama.cpp",
                    "--threads", str(args.threads), "--json", str(peers_out)])
        result["end_to_end"] = {r["system"]: r["e2e_tok_s"] for r in json.loads(peers_out.read_text())["results"]}
        result["end_to_end_file"] = peers_out.name
    result["load_after"] = load_average()
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "args"}, indent=1))


if __name__ == "__main__":
    main()
