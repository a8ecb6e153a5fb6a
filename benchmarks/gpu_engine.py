"""The engine on a GPU, measured through `Engine` (random weights of real shapes, no checkpoint).

    python -m interlock.benchmarks.gpu_engine [--out FILE] [--quick]          (make gpu-check runs it)

For each model shape (Llama-3.2-1B, Llama-3-8B; vocabulary: the embedded tokenizer's 49,152
byte-level tokens extended to 128,256 with merges of pairs of them, mask_bench.wide_tokenizer):
- tokens/s with and without a JSON-schema grammar at concurrency 1, 8 and 32, with `none` and
  `ngram+forced` (random weights: acceptance means nothing, tokens per step and step time are
  reported), and the engine's captured / eager step counts;
- the runtime's overhead: the engine's step time (batch 1, no speculation, no grammar) over the
  bare captured forward of the same row;
- captured vs eager engine steps (capture_steps=False);
- the peer on the same GPU: HF transformers `generate()` with xgrammar's logits processor, the
  same random weights, prompts and schema, at batch 1 and 8 (no speculation: its processor takes
  one token per step).
Writes the results (with each run's first request's token ids) to benchmarks/results/gpu-engine-DATE.json,
then prints the table. `--device cpu --shapes tiny` runs the same code on the CPU (the test does).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import torch

from interlock.benchmarks.gpu_bench import SCHEMA, SHAPES, VOCAB, device_name
from interlock.benchmarks.mask_bench import wide_embedded_tokenizer
from interlock.engine import Engine, EngineConfig
from interlock.models.config import ModelConfig, tiny_config
from interlock.models.device_llama import DeviceLlama
from interlock.models.loader import TINY, LoadedModel, load_tokenizer
from interlock.protocol.grammar import GrammarConfig, JsonSchema
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

PROMPT = "Extract the fields of the record below as JSON.\n" + "The quick brown fox jumps over the lazy dog. " * 12
MODES = ("none", "ngram+forced")


def random_model(shape: str, device: torch.device) -> LoadedModel:
    if shape == "tiny":
        tokenizer = load_tokenizer(TINY)
        config: ModelConfig = tiny_config(1088)
    else:
        tokenizer, config = wide_embedded_tokenizer(VOCAB), SHAPES[shape]
    config = config.replace(eos_token_id=tokenizer.eos_token_ids[0], max_position=2048)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = DeviceLlama.random(config, device, dtype=dtype)
    return LoadedModel(f"random-{shape}", model.config, model, tokenizer, 0.0)  # type: ignore[arg-type]


async def run_batch(engine: Engine, concurrency: int, grammar: object, max_tokens: int) -> dict[str, object]:
    """`concurrency` requests at once: tokens/s, and the engine's step counts over the run."""
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=grammar is None)
    before = await engine.metrics()
    outs: list = [None] * concurrency

    async def one(i: int) -> None:
        outs[i] = await engine.complete(f"{i}: {PROMPT}", grammar=grammar, sampling=sampling)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(concurrency):
            tg.start_soon(one, i)
    wall = time.perf_counter() - start
    after = await engine.metrics()
    steps = after.steps - before.steps
    tokens = sum(c.stats.output_tokens for c in outs)
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall, "steps": steps,
            "tokens_per_step": (after.output_tokens - before.output_tokens) / max(steps, 1),
            "step_ms": 1e3 * (after.step_s - before.step_s) / max(steps, 1),
            "replayed_steps": after.replayed_steps - before.replayed_steps,
            "eager_steps": after.eager_steps - before.eager_steps,
            "finish": sorted({c.finish_reason for c in outs}), "token_ids_first": list(outs[0].token_ids)}


async def engine_runs(loaded: LoadedModel, device: torch.device, concurrency: list[int], max_tokens: int,
                      capture: bool = True, modes: tuple[str, ...] = MODES, out: list | None = None,
                      save: Callable[[], None] | None = None) -> list[dict[str, object]]:
    """Each configuration's row, appended to `out` and saved (`save`) as soon as it is measured."""
    out = [] if out is None else out
    for mode in modes:
        # xgrammar, as the peer: the same masks, so greedy outputs can be compared token for token
        config = EngineConfig(speculative=SpeculativeConfig.parse(mode, max_draft_len=3), device=str(device),
                              grammar=GrammarConfig(backend="xgrammar"),
                              max_batch_size=max(concurrency), max_context=1024, kv_cache_bytes=16 << 30,
                              capture_steps=capture, prefix_caching=False, runner="device")
        async with Engine(loaded, config) as engine:
            for grammar in (None, JsonSchema(SCHEMA)):
                for conc in concurrency:
                    await run_batch(engine, conc, grammar, max_tokens)           # warm-up: compile, capture
                    row = await run_batch(engine, conc, grammar, max_tokens)
                    row.update(mode=mode, grammar=grammar is not None, concurrency=conc, captured=capture)
                    print(json.dumps({k: v for k, v in row.items() if k != "token_ids_first"}), flush=True)
                    out.append(row)
                    if save is not None:
                        save()                          # partial results survive a crash or a kill
    return out


def bare_forward_ms(loaded: LoadedModel, device: torch.device, rows: int, repeats: int = 50) -> float:
    """The target forward alone over `rows` rows at ~prompt length, captured on CUDA (eager elsewhere)."""
    from interlock.models.batch import SeqChunk
    from interlock.models.device_llama import step_inputs
    from interlock.models.kv_cache import PagedKVCache

    model = loaded.model
    kv = PagedKVCache(model.config, num_blocks=64, block_size=16, device=device)
    kv.add_sequence(0)
    start = kv.reserve(0, 200 + rows)
    inputs = step_inputs([SeqChunk(0, (5,) * rows, start + 200, ())], kv, max_blocks=64, device=device)
    run = lambda: model(inputs, kv)  # noqa: E731
    if device.type == "cuda":
        from interlock.benchmarks.gpu_bench import _capture

        run = _capture(run).replay
    for _ in range(3):
        run()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start_t = time.perf_counter()
    for _ in range(repeats):
        run()
    sync()
    return 1e3 * (time.perf_counter() - start_t) / repeats


def hf_peer(loaded: LoadedModel, device: torch.device, batch: int, max_tokens: int) -> dict[str, object]:
    """HF generate() + xgrammar's logits processor on the same weights, prompts and schema."""
    import xgrammar as xgr
    from transformers import LlamaConfig, LlamaForCausalLM

    m, c = loaded.model, loaded.model.config
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(m.embed.dtype)          # built on the device in its dtype: no 32 GB host copy of an 8B
    try:
        with torch.device(device):
            hf = LlamaForCausalLM(LlamaConfig(
                vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads,
                head_dim=c.head_dim, rope_theta=c.rope_theta, max_position_embeddings=c.max_position,
                rms_norm_eps=c.rms_eps, tie_word_embeddings=c.tie_embeddings)).eval()
    finally:
        torch.set_default_dtype(default_dtype)
    q, kv = c.q_size, c.kv_size
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(m.embed)
        hf.model.norm.weight.copy_(m.norm)
        hf.lm_head.weight.copy_(m.head)
        for layer, x in zip(hf.model.layers, m.layers):
            a = layer.self_attn
            for proj, w in ((a.q_proj, x.wqkv[:q]), (a.k_proj, x.wqkv[q: q + kv]), (a.v_proj, x.wqkv[q + kv:]),
                            (a.o_proj, x.wo), (layer.mlp.gate_proj, x.w13[: c.intermediate_size]),
                            (layer.mlp.up_proj, x.w13[c.intermediate_size:]), (layer.mlp.down_proj, x.w2)):
                proj.weight.copy_(w)
            layer.input_layernorm.weight.copy_(x.attention_norm)
            layer.post_attention_layernorm.weight.copy_(x.ffn_norm)
    tok = loaded.tokenizer
    info = xgr.TokenizerInfo.from_huggingface(tok.hf, vocab_size=c.vocab_size)
    # the grammar the engine compiles (compact JSON: grammars/xgrammar_backend.py), so greedy outputs can agree
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA), any_whitespace=False,
                                                             separators=(",", ":"), strict_mode=False)
    ids = [tok.encode(f"{i}: {PROMPT}") for i in range(batch)]
    width = max(map(len, ids))
    input_ids = torch.tensor([[0] * (width - len(x)) + x for x in ids], device=device)
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)
    times, new = [], 0
    for _ in range(3):                         # the first is the warm-up
        start = time.perf_counter()
        out = hf.generate(input_ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False,
                          logits_processor=[xgr.contrib.hf.LogitsProcessor(compiled)], pad_token_id=0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        new = int((out[:, width:] != 0).sum())
    wall = statistics.median(times[1:])
    return {"batch": batch, "tokens": new, "wall_s": wall, "tokens_per_s": new / wall,
            "token_ids_first": out[0, width:].tolist()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="results JSON (default benchmarks/results/gpu-engine-DATE.json)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", nargs="+", default=["llama3.2-1b", "llama3-8b"], choices=[*SHAPES, "tiny"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="the 1B shape at concurrency 1 and 8 only")
    args = parser.parse_args(argv)
    if args.quick:
        args.shapes, args.concurrency = ["llama3.2-1b"], [1, 8]
    device = torch.device(args.device)
    today = datetime.date.today().isoformat()
    out_path = Path(args.out or Path(__file__).parent / "results" / f"gpu-engine-{today}.json")
    results: dict[str, object] = {"device": device_name() if device.type == "cuda" else "cpu", "date": today,
                                  "torch": torch.__version__, "max_tokens": args.max_tokens, "shapes": {}}

    def save() -> None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(results, indent=1))

    for shape in args.shapes:
        r: dict[str, object] = {}
        results["shapes"][shape] = r          # type: ignore[index]
        loaded = None
        try:
            loaded = random_model(shape, device)
            r["engine"] = []
            anyio.run(engine_runs, loaded, device, args.concurrency, args.max_tokens, True, MODES, r["engine"], save)
            r["eager"] = anyio.run(engine_runs, loaded, device, [1], args.max_tokens, False, ("none",))
            r["bare_forward_ms"] = bare_forward_ms(loaded, device, rows=1)
            r["peer"] = [hf_peer(loaded, device, b, args.max_tokens) for b in (1, max(args.concurrency[:2]))]
        except Exception as exc:  # noqa: BLE001 - record it, measure the other shapes
            r["error"] = repr(exc)
        save()
        loaded = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print_table(results)
    print(f"saved {out_path}")


def print_table(results: dict[str, object]) -> None:
    print(f"\ndevice: {results['device']}  max_tokens={results['max_tokens']}")
    for shape, r in results["shapes"].items():  # type: ignore[union-attr]
        if "error" in r:
            print(f"{shape}: ERROR {r['error']}")
        rows = r.get("engine", [])
        for conc in sorted({x["concurrency"] for x in rows}):
            for mode in MODES:
                free = [x for x in rows if x["concurrency"] == conc and x["mode"] == mode and not x["grammar"]]
                json_ = [x for x in rows if x["concurrency"] == conc and x["mode"] == mode and x["grammar"]]
                if free and json_:
                    f, g = free[0], json_[0]
                    print(f"{shape:<12} c={conc:<3} {mode:<13} free {f['tokens_per_s']:8.1f} tok/s  json "
                          f"{g['tokens_per_s']:8.1f} tok/s  grammar cost {100 * (f['tokens_per_s'] / g['tokens_per_s'] - 1):+6.1f}%"
                          f"  step {g['step_ms']:.2f} ms  tok/step {g['tokens_per_step']:.2f}"
                          f"  replayed {g['replayed_steps']}/{g['steps']}")
        base = next((x for x in rows if x["concurrency"] == 1 and x["mode"] == "none" and not x["grammar"]), None)
        if base and r.get("bare_forward_ms"):
            print(f"{shape:<12} runtime overhead at batch 1: step {base['step_ms']:.2f} ms / bare forward "
                  f"{r['bare_forward_ms']:.2f} ms = {base['step_ms'] / r['bare_forward_ms']:.2f}")
        if r.get("eager") and base:
            print(f"{shape:<12} eager engine step {r['eager'][0]['step_ms']:.2f} ms vs captured {base['step_ms']:.2f} ms")
        for p in r.get("peer", []):
            ours = next((x for x in rows if x["concurrency"] == p["batch"] and x["mode"] == "none" and x["grammar"]),
                        None)
            ratio = f"  engine/peer {ours['tokens_per_s'] / p['tokens_per_s']:.2f}x" if ours else ""
            print(f"{shape:<12} HF + xgrammar batch {p['batch']}: {p['tokens_per_s']:.1f} tok/s{ratio}")


if __name__ == "__main__":
    main()
