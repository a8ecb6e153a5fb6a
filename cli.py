"""The `interlock` command: `run` (the embedded demo), `generate`, `bench`, `serve`.

`generate` writes only the generated text to stdout (logs and stats go to stderr), so it composes
in shell pipelines.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from interlock.protocol.errors import InterlockError
from interlock.protocol.grammar import BACKENDS, DEFAULT_BACKEND
from interlock.protocol.speculative import DEFAULT_DRAFT_LEN, DEFAULT_SPECULATIVE, MAX_DRAFT_LEN
from interlock.protocol.types import DEFAULT_PREFILL, DTYPES, PREFILL_MODES

if TYPE_CHECKING:
    from interlock.server import ServerConfig

DEMO_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "company": {"type": "string"},
        "role": {"type": "string"},
        "city": {"type": "string"},
        "start_year": {"type": "integer"},
        "languages": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "company", "role", "city", "start_year", "languages"],
    "additionalProperties": False,
}
# SmolLM2-135M gets every field of this text right (greedy; tests/test_cli.py checks it); of the
# phrasings tried, most made it write the year as 12 or 1999, or the languages as one "Rust and Python".
DEMO_TEXT = ("Maria Chen joined Northwind Labs as a staff engineer in 2019. She lives in Lisbon. "
             "She programs in Rust and in Python.")


def _spec_from_args(args: argparse.Namespace):
    from interlock.protocol.grammar import Choice, Ebnf, JsonObject, JsonSchema, Lark, Regex

    if args.schema:
        return JsonSchema(Path(args.schema).read_text())
    if args.json_object:
        return JsonObject()
    if args.regex:
        return Regex(args.regex)
    if args.grammar:
        text = Path(args.grammar).read_text()
        return Lark(text) if args.grammar.endswith(".lark") else Ebnf(text)
    if args.choice:
        return Choice(args.choice)
    return None


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """Engine.from_pretrained's keywords from a command's arguments: the one place where flags become
    engine options, so that `serve` in one process and `serve --replicas` (each replica calls
    from_pretrained with them) build the same engine, and run / generate the same but for the batch."""
    return {"speculative": args.speculative, "draft_len": args.draft_len, "grammar_backend": args.backend,
            "max_batch_size": getattr(args, "max_batch_size", 1), "tensor_parallel": args.tensor_parallel,
            "threads": args.threads, "prefill": args.prefill, "kv_dtype": _kv_dtype(args), "device": args.device}


def _engine(args: argparse.Namespace):
    from interlock.engine import Engine

    return Engine.from_pretrained(args.model, **engine_options(args))


async def _run(args: argparse.Namespace) -> None:
    """The demo: stream a JSON extraction with speculation, then time the same request without."""
    from interlock.engine import Engine, EngineConfig
    from interlock.protocol.grammar import GrammarConfig, JsonSchema
    from interlock.protocol.sampling import SamplingParams

    messages = [
        {"role": "system", "content": "Reply with a JSON object with the fields name, company, role, city, "
                                      "start_year and languages, taken from the user's text."},
        {"role": "user", "content": "Text: " + DEMO_TEXT},
    ]
    grammar, sampling = JsonSchema(DEMO_SCHEMA), SamplingParams(max_tokens=128)
    print(f"model: {args.model}   grammar: JSON schema   speculative: {args.speculative} (K={args.draft_len})",
          file=sys.stderr)
    print(f"text:  {DEMO_TEXT}\n", file=sys.stderr)
    engine = _engine(args)
    async with engine:
        await engine.complete(messages, grammar=grammar, sampling=SamplingParams(max_tokens=8))   # warm-up
        stats = None
        async for delta in engine.generate(messages, grammar=grammar, sampling=sampling):
            print(delta.text, end="", flush=True)
            stats = delta.stats or stats
        print()
    base_config = EngineConfig(speculative=None, grammar=GrammarConfig(backend=args.backend), max_batch_size=1,
                               threads=args.threads, prefill=args.prefill, device=args.device)
    async with Engine(engine.model, base_config) as baseline:
        base = (await baseline.complete(messages, grammar=grammar, sampling=sampling)).stats
    assert stats is not None
    print(f"\n{stats.output_tokens} tokens  {stats.tokens_per_s:.1f} tok/s  "
          f"mean acceptance length {stats.mean_acceptance_length:.2f}  "
          f"speedup {stats.tokens_per_s / base.tokens_per_s:.2f}x over no speculation "
          f"({base.tokens_per_s:.1f} tok/s)  ttft {stats.ttft_s * 1e3:.0f} ms  "
          f"exposed grammar {stats.exposed_grammar_ms:.1f} ms")


async def _generate(args: argparse.Namespace) -> None:
    from interlock.protocol.sampling import SamplingParams

    sampling = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed,
                              guidance_scale=args.guidance_scale, presence_penalty=args.presence_penalty,
                              frequency_penalty=args.frequency_penalty, repetition_penalty=args.repetition_penalty)
    prompt = args.prompt if args.raw else [{"role": "user", "content": args.prompt}]
    negative = args.negative_prompt
    if negative is not None and not args.raw:
        negative = [{"role": "user", "content": negative}]
    async with _engine(args) as engine:
        stats = finish = None
        async for delta in engine.generate(prompt, grammar=_spec_from_args(args), sampling=sampling,
                                           negative_prompt=negative):
            sys.stdout.write(delta.text)
            sys.stdout.flush()
            stats, finish = delta.stats or stats, delta.finish_reason or finish
    sys.stdout.write("\n")
    if stats is not None:
        line = {"finish_reason": finish, "output_tokens": stats.output_tokens, "steps": stats.steps,
                "mean_acceptance_length": round(stats.mean_acceptance_length, 3),
                "tokens_per_s": round(stats.tokens_per_s, 2), "ttft_s": round(stats.ttft_s, 4),
                "exposed_grammar_ms": round(stats.exposed_grammar_ms, 3)}
        print(json.dumps(line) if args.json_stats else "  ".join(f"{k}={v}" for k, v in line.items()),
              file=sys.stderr)


async def _bench(args: argparse.Namespace) -> None:
    from interlock.benchmarks.engine_bench import BenchConfig, bench_rows, report, run_modes
    from interlock.models.loader import load_model

    cfg = BenchConfig(dataset=Path(args.dataset), limit=args.limit, draft_len=args.draft_len,
                      backend=args.backend, concurrency=args.concurrency,
                      max_tokens=args.max_tokens, temperature=args.temperature,
                      presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                      repetition_penalty=args.repetition_penalty, threads=args.threads, prefill=args.prefill,
                      repeat_schema=args.repeat_schema, repeats=args.repeats, device=args.device)
    try:
        bench_rows(cfg)                 # before the model loads: a bad row is a usage error
    except (KeyError, ValueError) as exc:
        print(f"interlock bench: error: argument --repeat-schema: {exc.args[0]}", file=sys.stderr)
        raise SystemExit(2) from None
    modes = [m.strip() for m in args.speculative.split(",") if m.strip()]
    caching = {"on": (True,), "off": (False,), "both": (True, False)}[args.prefix_caching]
    results = await run_modes(_bench_model(args, load_model), cfg, modes, prefix_caching=caching, rounds=args.rounds)
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results if len(results) > 1 else results[0], indent=2) + "\n")


def _server_config(args: argparse.Namespace) -> ServerConfig:
    from interlock.server import ServerConfig

    return ServerConfig(model_name=args.served_model_name or args.model, host=args.host, port=args.port,
                        api_key=args.api_key, max_queue=args.max_queue, max_body_bytes=args.max_body_bytes,
                        default_max_tokens=args.max_tokens, shutdown_timeout_s=args.shutdown_timeout,
                        reasoning=args.reasoning)


def _serve_replicas(args: argparse.Namespace) -> None:
    """`serve --replicas N`: the same server, N times, on Ray Serve (server/ray_serve.py)."""
    from interlock.server.ray_serve import ReplicaConfig, run_replicas

    replicas = ReplicaConfig(min_replicas=args.replicas, max_replicas=max(args.max_replicas or 0, args.replicas),
                             cpus_per_replica=args.cpus_per_replica, graceful_shutdown_timeout_s=args.shutdown_timeout,
                             engine_options=engine_options(args))
    config = _server_config(args)
    print(f"interlock serve: {config.model_name} on http://{config.host}:{config.port}/v1 "
          f"({replicas.min_replicas}..{replicas.max_replicas} replicas on Ray Serve)", file=sys.stderr, flush=True)
    run_replicas(args.model, config, replicas)


async def _serve(args: argparse.Namespace) -> None:
    """The OpenAI-compatible server (interlock.server) over one engine, until SIGTERM / SIGINT."""
    from interlock.server import serve

    config = _server_config(args)
    engine = _engine(args)
    print(f"interlock serve: {config.model_name} on http://{config.host}:{config.port}/v1 "
          f"(speculative {args.speculative}, batch {args.max_batch_size})", file=sys.stderr, flush=True)
    await serve(engine, config, log_level=args.log_level)


MODEL_HELP = ("smollm2-135m-instruct (embedded), a .gguf file, an HF checkpoint folder or a Hugging Face hub id "
              "such as Qwen/Qwen2.5-0.5B-Instruct (HF_HUB_OFFLINE=1: from the local cache only)")
SPECULATIVE_HELP = ("none, or drafters joined by +: ngram[:N], suffix, forced[:N] (N forced rows beyond --draft-len, "
                    "4 by default), self-draft[:N], draft:PATH; options: adaptive, nomask (no draft-side grammar "
                    "masking), e.g. ngram+forced+adaptive or self-draft+forced")
TP_HELP = ("N > 1: the model's forward on N worker processes (torch.distributed gloo), each holding 1/N of "
           "the weights; N must divide the model's heads, KV heads and MLP width")


def _bench_model(args: argparse.Namespace, load_model: Any) -> Any:
    """The model `bench` runs: int8 for the CPU engine, float weights for the device runner (CUDA)."""
    from interlock.engine import EngineConfig

    config = EngineConfig(device=args.device)
    if config.runner_for(config.torch_device()) == "device":
        return load_model(args.model, weights="float", dtype="bfloat16")
    return load_model(args.model, kv_dtype=_kv_dtype(args))


def _device(text: str) -> str:
    """--device: cpu, cuda, cuda:N or auto (EngineConfig.device), a usage error otherwise."""
    from interlock.engine.config import DEVICE_PATTERN

    if not DEVICE_PATTERN.match(text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda, cuda:N or auto, got {text!r}")
    return text


def _kv_dtype(args: argparse.Namespace) -> str | None:
    """--kv-cache-dtype as load_model's kv_dtype (None: the loader's default)."""
    return None if args.kv_cache_dtype == "auto" else args.kv_cache_dtype


def _speculative(text: str) -> str:
    """argparse type for --speculative: each comma-separated mode must parse (SpeculativeConfig.parse),
    so a typo is a usage error naming the flag, not a traceback after the model has loaded."""
    from interlock.protocol.speculative import SpeculativeConfig

    for mode in text.split(","):
        try:
            SpeculativeConfig.parse(mode)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _file(text: str) -> str:
    """argparse type for a file argument: a missing file is a usage error naming the flag, before
    the model loads, not a traceback after it."""
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    return text


def _positive_int(text: str) -> int:
    """argparse type for counts (threads, batch sizes, draft length): a usage error, not a traceback."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _draft_len(text: str) -> int:
    """argparse type for --draft-len: 1 .. MAX_DRAFT_LEN, a usage error otherwise."""
    value = _positive_int(text)
    if value > MAX_DRAFT_LEN:
        raise argparse.ArgumentTypeError(f"expected a draft length in 1..{MAX_DRAFT_LEN}, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="interlock", description="Grammar-constrained speculative decoding.")
    parser.add_argument("--log-json", action="store_true", help="log JSON lines to stderr")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--threads", type=_positive_int, default=None,
                        help="torch intra-op threads of the model lane (default: min(2, cores); every other "
                             "thread runs torch at 1)")
    parser.add_argument("--device", type=_device, default="cpu",
                        help="where the model runs: cpu (default), cuda, cuda:N, or auto (CUDA when torch sees "
                             "one); on CUDA the weights are bf16 and steps are CUDA graphs (docs/gpu.md)")
    parser.add_argument("--prefill", default=DEFAULT_PREFILL, choices=PREFILL_MODES,
                        help="how prompt chunks are computed (EngineConfig.prefill): rows (int8, batch invariant: "
                             "prefix-cache hits at any block), dense (bf16, unquantized weights), auto (rows "
                             "where the CPU has AMX or AVX512-VNNI)")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", *DTYPES],
                        help="what the KV cache stores (load_model's kv_dtype): auto is float16 beside int8 "
                             "weights on an AVX-512 CPU (half the bytes a long context's step reads), else float32")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, max_tokens: int) -> None:
        p.add_argument("--model", default="smollm2-135m-instruct", help=MODEL_HELP)
        p.add_argument("--speculative", type=_speculative, default=DEFAULT_SPECULATIVE, help=SPECULATIVE_HELP)
        p.add_argument("--draft-len", type=_draft_len, default=DEFAULT_DRAFT_LEN)
        p.add_argument("--backend", default=DEFAULT_BACKEND, choices=BACKENDS)
        p.add_argument("--temperature", type=float, default=0.0)
        p.add_argument("--max-tokens", type=int, default=max_tokens)
        p.add_argument("--tensor-parallel", type=_positive_int, default=1, help=TP_HELP)
        p.add_argument("--presence-penalty", type=float, default=0.0,
                       help="OpenAI's: minus this once per token seen in the output")
        p.add_argument("--frequency-penalty", type=float, default=0.0,
                       help="OpenAI's: minus this per occurrence in the output")
        p.add_argument("--repetition-penalty", type=float, default=1.0,
                       help="CTRL/HF: logits of tokens in the prompt or output divided (if > 0) or multiplied by this")

    common(sub.add_parser("run", help="the embedded demo"), 128)
    gen = sub.add_parser("generate", help="generate text for one prompt")
    gen.add_argument("prompt")
    common(gen, 256)
    gen.add_argument("--raw", action="store_true", help="use the prompt as is (no chat template)")
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--json-stats", action="store_true")
    gen.add_argument("--guidance-scale", type=float, default=None,
                     help="classifier-free guidance: logits = uncond + S * (cond - uncond); S > 1 follows the "
                          "prompt more (each step also forwards the unconditional sequence)")
    gen.add_argument("--negative-prompt", default=None,
                     help="the unconditional prompt for --guidance-scale (default: an empty user message)")
    g = gen.add_mutually_exclusive_group()
    g.add_argument("--schema", type=_file, help="JSON schema file")
    g.add_argument("--json-object", action="store_true")
    g.add_argument("--regex")
    g.add_argument("--grammar", type=_file, help="EBNF/GBNF file (.lark: Lark)")
    g.add_argument("--choice", nargs="+")
    bench = sub.add_parser("bench", help="JSONSchemaBench rows through the engine",
                           description="--speculative may list several modes, comma-separated "
                                       "(e.g. none,ngram+forced,self-draft+forced): they run in turn on the same rows "
                                       "and the table gives each one's tokens/s ratio to the first (with --rounds, "
                                       "each mode's median run's).")
    bench.add_argument("--dataset", type=_file, required=True)
    bench.add_argument("--limit", type=int)
    bench.add_argument("--repeat-schema", metavar="ROW", help="one row's schema, --limit documents (default 50) made "
                       "from its instance: the repeated-schema workload (python -m interlock.benchmarks.peers uses "
                       "JME_26 of JME.jsonl)")
    bench.add_argument("--repeats", type=_positive_int, default=1,
                       help="run each prompt this many times in a row (a warm-up and timed runs: later runs find "
                            "the prompt in the prefix cache and the earlier output in the suffix drafter's global "
                            "trie)")
    bench.add_argument("--concurrency", type=_positive_int, default=1)
    bench.add_argument("--rounds", type=_positive_int, default=1,
                       help="run the modes this many times, the order reversed every other round (A B C, C B A, "
                            "...), and report each mode's median run: on a host whose speed drifts from minute to "
                            "minute, one pass's ratios can be off by 10-20%%")
    bench.add_argument("--json", help="also write the result JSON here")
    bench.add_argument("--prefix-caching", choices=["on", "off", "both"], default="on",
                       help="share cached prompt blocks between requests; both: run each mode with, then without")
    common(bench, 256)
    srv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (chat/completions, structured outputs, "
                                       "tools, SSE, /metrics)")
    srv.add_argument("--model", default="smollm2-135m-instruct", help=MODEL_HELP)
    srv.add_argument("--served-model-name", default=None, help="the `model` id clients send (default: --model)")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--speculative", type=_speculative, default=DEFAULT_SPECULATIVE,
                     help="as for generate; fixed for every request")
    srv.add_argument("--draft-len", type=_draft_len, default=DEFAULT_DRAFT_LEN)
    srv.add_argument("--backend", default=DEFAULT_BACKEND, choices=BACKENDS)
    srv.add_argument("--max-batch-size", type=_positive_int, default=8)
    srv.add_argument("--max-queue", type=int, default=64,
                     help="requests admitted beyond the batch; past it the server answers 429 with Retry-After")
    srv.add_argument("--max-tokens", type=int, default=256, help="for requests that give no max_tokens")
    srv.add_argument("--max-body-bytes", type=int, default=1 << 20)
    srv.add_argument("--reasoning", action="store_true",
                     help="chat outputs think freely up to </think>, then follow the request's grammar; "
                          "the thinking is returned as reasoning_content")
    srv.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1/*")
    srv.add_argument("--shutdown-timeout", type=float, default=10.0,
                     help="seconds requests in flight get to finish after SIGTERM/SIGINT")
    srv.add_argument("--tensor-parallel", type=_positive_int, default=1, help=TP_HELP)
    srv.add_argument("--device", type=_device, default=argparse.SUPPRESS,
                     help="as the global --device (interlock --device cuda serve), given after serve")
    srv.add_argument("--replicas", type=int, default=None,
                     help="N engine replicas behind Ray Serve's proxy (needs the [cluster] extra; joins the "
                          "cluster in RAY_ADDRESS if set, else starts a local Ray)")
    srv.add_argument("--max-replicas", type=int, default=None, help="with --replicas: autoscale up to this many")
    srv.add_argument("--cpus-per-replica", type=float, default=1.0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from interlock.logs import configure_logging

    configure_logging(json=args.log_json, level=args.log_level)
    import torch

    # The model lane runs torch at --threads (EngineConfig.threads); every other thread of this
    # process at 1, so that the lane's OpenMP pool is the only one (see streams/cpu_timeline.py).
    torch.set_num_threads(1)
    if args.command == "serve" and args.replicas:
        try:
            _serve_replicas(args)
        except InterlockError as exc:
            print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
        return 0
    command = {"run": _run, "generate": _generate, "bench": _bench, "serve": _serve}[args.command]
    try:
        anyio.run(command, args)
    except InterlockError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
