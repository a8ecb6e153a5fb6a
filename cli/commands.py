"""What each command does. Results go to stdout (the generated text, the demo's answer, bench's
tables; JSON only when asked); progress, stats and logs go to stderr. What can fail without the
model (a grammar, a tensor-parallel size) is checked before it loads."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from interlock.cli.progress import counted, stderr_console, step
from interlock.protocol.types import Dtype

if TYPE_CHECKING:
    from interlock.engine import Engine
    from interlock.protocol.grammar import GrammarSpec
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
# SmolLM2-135M gets every field of this text right (greedy; tests/test_cli.py checks it) after one
# worked example in the chat. Without the example its answer sat on the model's margin: right with
# some kernels and KV-cache dtypes, wrong with others (the year as 12 or 1999, the languages as one
# "Rust and Python"); with it, right in all eight numeric configurations tried (SIMD and portable
# kernels, fp16 and fp32 cache, dense and rows prompt path).
DEMO_TEXT = ("Maria Chen joined Northwind Labs as a staff engineer in 2019. She lives in Lisbon. "
             "She programs in Rust and in Python.")
DEMO_EXAMPLE = ("Tom Okafor joined Bluefin Systems as a data analyst in 2015. He lives in Nairobi. "
                "He programs in Go and in SQL.",
                {"name": "Tom Okafor", "company": "Bluefin Systems", "role": "data analyst", "city": "Nairobi",
                 "start_year": 2015, "languages": ["Go", "SQL"]})


def demo_messages() -> list[dict[str, str]]:
    """The demo's chat: the instruction, one worked example, then DEMO_TEXT."""
    example_text, example_answer = DEMO_EXAMPLE
    return [
        {"role": "system", "content": "Reply with a JSON object with the fields name, company, role, city, "
                                      "start_year and languages, taken from the user's text."},
        {"role": "user", "content": "Text: " + example_text},
        {"role": "assistant", "content": json.dumps(example_answer)},
        {"role": "user", "content": "Text: " + DEMO_TEXT},
    ]


def kv_dtype(args: argparse.Namespace) -> Dtype | None:
    """--kv-cache-dtype as load_model's kv_dtype (None: the loader's default)."""
    return None if args.kv_cache_dtype == "auto" else args.kv_cache_dtype


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """Engine.from_pretrained's keywords from a command's arguments: the one place where flags become
    engine options, so that `serve` in one process and `serve --replicas` (each replica calls
    from_pretrained with them) build the same engine, and run / generate the same but for the batch."""
    return {"speculative": args.speculative, "draft_len": args.draft_len, "grammar_backend": args.backend,
            "max_batch_size": getattr(args, "max_batch_size", 1), "tensor_parallel": args.tensor_parallel,
            "threads": args.threads, "prefill": args.prefill, "kv_dtype": kv_dtype(args), "device": args.device,
            "weights": args.weights}


def one_torch_thread() -> None:
    """The model lane runs torch at --threads (EngineConfig.threads); every other thread of this
    process at 1, so that the lane's OpenMP pool is the only one (see streams/cpu_timeline.py).
    Called inside a command's first progress step: importing torch is a second or more of the wait."""
    import torch

    torch.set_num_threads(1)


def load_engine(args: argparse.Namespace, console: Console) -> Engine:
    """The command's engine, loaded (not started) under one progress line that starts before torch
    is imported, so that the time it gives is the whole wait."""
    with step(console, f"loading {args.model}"):
        return new_engine(args, console)


@asynccontextmanager
async def started_engine(args: argparse.Namespace, console: Console) -> AsyncIterator[Engine]:
    """load_engine and the engine's start under one progress line: all the wait before a request."""
    async with AsyncExitStack() as stack:
        with step(console, f"loading {args.model}"):
            engine = await stack.enter_async_context(new_engine(args, console))
        yield engine


def new_engine(args: argparse.Namespace, console: Console) -> Engine:
    one_torch_thread()
    from interlock.engine import Engine

    if args.device == "cpu" and args.tensor_parallel == 1:
        convert_weights(args, console)
    return Engine.from_pretrained(args.model, **engine_options(args))


def convert_weights(args: argparse.Namespace, console: Console) -> None:
    """A GGUF's first start: its conversion into the weight cache, layer by layer, shown as it goes
    (seconds for the embedded model, minutes for an 8B one); nothing when the cache has it."""
    from interlock.models.loader import convert_if_needed

    with counted(console, f"converting {args.model}'s weights, once, layer") as report:
        convert_if_needed(args.model, args.weights, report)


def spec_from_args(args: argparse.Namespace) -> GrammarSpec | None:
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


GRAMMAR_FLAGS = ("schema", "json_object", "regex", "grammar", "choice")    # generate's, at most one given


def grammar_flag(args: argparse.Namespace) -> str | None:
    """The flag that gave generate its grammar, as the user typed it (None: no grammar flag)."""
    from interlock.cli.parser import flag

    return next((flag(f) for f in GRAMMAR_FLAGS if getattr(args, f, None)), None)


def precheck_grammar(args: argparse.Namespace) -> bool:
    """What can be told without a tokenizer (a schema that is no schema or asks for a keyword no
    backend enforces, a regex or grammar that does not parse): grammars/precheck.py imports neither
    torch nor a backend, so this answers at once. True: the grammar is known to compile (or there is
    none); False: only a compile with the model's tokenizer can tell (`check_grammar`)."""
    from interlock.grammars.precheck import precheck

    spec = spec_from_args(args)
    return spec is None or precheck(spec, args.backend) == "compiles"


async def check_grammar(args: argparse.Namespace, spec: GrammarSpec) -> None:
    """Compile the grammar with the model's tokenizer alone, as the engine will (its compile
    timeout): a bad one is a GrammarError now, not after seconds of loading the model. Only where
    `precheck_grammar` could not tell: it takes seconds (torch, the backends, the tokenizer)."""
    one_torch_thread()
    from interlock.actors.grammar_layer import GrammarLayer
    from interlock.models.loader import load_tokenizer
    from interlock.protocol.grammar import GrammarConfig

    tokenizer = load_tokenizer(args.model)
    await GrammarLayer(tokenizer, tokenizer.vocab_size, GrammarConfig(backend=args.backend)).compile(spec)


async def run_demo(args: argparse.Namespace) -> None:
    """The demo: stream a JSON extraction with speculation, then time the same request without."""
    from interlock.engine import Engine, EngineConfig
    from interlock.protocol.grammar import GrammarConfig, JsonSchema
    from interlock.protocol.sampling import SamplingParams

    messages = demo_messages()
    grammar, sampling = JsonSchema(DEMO_SCHEMA), SamplingParams(max_tokens=128)
    console = stderr_console()
    console.print(f"model: {args.model}   grammar: JSON schema   speculative: {args.speculative} "
                  f"(K={args.draft_len})\ntext:  {DEMO_TEXT}\n")
    engine = load_engine(args, console)
    async with engine:
        await engine.complete(messages, grammar=grammar, sampling=SamplingParams(max_tokens=8))   # warm-up
        stats = None
        async for delta in engine.generate(messages, grammar=grammar, sampling=sampling):
            print(delta.text, end="", flush=True)
            stats = delta.stats or stats
        print()
    base_config = EngineConfig(speculative=None, grammar=GrammarConfig(backend=args.backend), max_batch_size=1,
                               threads=args.threads, prefill=args.prefill, device=args.device)
    with step(console, "the same request without speculation"):
        async with Engine(engine.model, base_config) as baseline:
            base = (await baseline.complete(messages, grammar=grammar, sampling=sampling)).stats
    assert stats is not None
    rate, base_rate = stats.tokens_per_s or 0.0, base.tokens_per_s or 0.0
    print(f"\n{stats.output_tokens} tokens  {rate:.1f} tok/s  mean acceptance length "
          f"{stats.mean_acceptance_length:.2f}  speedup {rate / max(base_rate, 1e-9):.2f}x over no speculation "
          f"({base_rate:.1f} tok/s)  ttft {stats.ttft_s * 1e3:.0f} ms  "
          f"exposed grammar {stats.exposed_grammar_ms:.1f} ms")


def sampling_from_args(args: argparse.Namespace) -> Any:
    """generate's SamplingParams, checked with the library's own rules (its ranges, and a negative
    prompt only with guidance): cheap, so main runs it before anything heavy is imported."""
    from interlock.protocol.sampling import SamplingParams, check_guidance

    sampling = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed,
                              guidance_scale=args.guidance_scale, presence_penalty=args.presence_penalty,
                              frequency_penalty=args.frequency_penalty, repetition_penalty=args.repetition_penalty,
                              law=args.law, max_attempts=args.max_attempts)
    check_guidance(sampling, args.negative_prompt)
    return sampling


async def generate(args: argparse.Namespace) -> None:
    sampling = sampling_from_args(args)
    spec = spec_from_args(args)
    console = stderr_console()
    if spec is not None and not precheck_grammar(args):
        with step(console, "checking the grammar"):
            await check_grammar(args, spec)
    async with started_engine(args, console) as engine:
        # a base model has no chat template: its prompt is the text itself, as llama.cpp sends it
        chat = not args.raw and engine.tokenizer.has_chat_template
        prompt = [{"role": "user", "content": args.prompt}] if chat else args.prompt
        negative = args.negative_prompt
        if negative is not None and chat:
            negative = [{"role": "user", "content": negative}]
        stats = finish = None
        async for delta in engine.generate(prompt, grammar=spec, sampling=sampling, negative_prompt=negative):
            sys.stdout.write(delta.text)
            sys.stdout.flush()
            stats, finish = delta.stats or stats, delta.finish_reason or finish
    sys.stdout.write("\n")
    if stats is not None:
        rate = stats.tokens_per_s
        line = {"finish_reason": finish, "output_tokens": stats.output_tokens, "steps": stats.steps,
                "mean_acceptance_length": round(stats.mean_acceptance_length, 3),
                "tokens_per_s": None if rate is None else round(rate, 2), "ttft_s": round(stats.ttft_s, 4),
                "exposed_grammar_ms": round(stats.exposed_grammar_ms, 3),
                "attempts": stats.attempts if sampling.law == "conditional" else None}
        # text mode leaves out what has no value (no rate for a one-token output); JSON keeps its null
        print(json.dumps(line) if args.json_stats else "  ".join(f"{k}={v}" for k, v in line.items() if v is not None),
              file=sys.stderr)


async def bench(args: argparse.Namespace) -> None:
    from interlock.benchmarks.engine_bench import BenchConfig, bench_rows, report, run_modes

    cfg = BenchConfig(dataset=args.dataset, limit=args.limit, draft_len=args.draft_len,
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
    console = stderr_console()
    with step(console, f"loading {args.model}"):
        one_torch_thread()
        model = bench_model(args)
    results = await run_modes(model, cfg, modes, prefix_caching=caching, rounds=args.rounds)
    report(results, console if args.json else None)          # with --json, stdout is the JSON's alone
    text = json.dumps(results if len(results) > 1 else results[0], indent=2) + "\n"
    if args.out:
        Path(args.out).write_text(text)
        console.print(f"results: {args.out}", style="dim")
    if args.json:
        sys.stdout.write(text)


def bench_model(args: argparse.Namespace) -> Any:
    """The model `bench` runs: --weights for the CPU engine, float weights for the device runner (CUDA)."""
    from interlock.engine import EngineConfig
    from interlock.models.loader import load_model

    config = EngineConfig(device=args.device)
    if config.runner_for(config.torch_device()) == "device":
        return load_model(args.model, weights="float", dtype="bfloat16")
    return load_model(args.model, weights=args.weights, kv_dtype=kv_dtype(args))


def server_config(args: argparse.Namespace) -> ServerConfig:
    from interlock.server import ServerConfig

    return ServerConfig(model_name=args.served_model_name or args.model, host=args.host, port=args.port,
                        api_key=args.api_key, max_queue=args.max_queue, max_body_bytes=args.max_body_bytes,
                        default_max_tokens=args.max_tokens, shutdown_timeout_s=args.shutdown_timeout,
                        reasoning=args.reasoning, access_log=args.access_log)


def serve_replicas(args: argparse.Namespace) -> None:
    """`serve --replicas N`: the same server, N times, on Ray Serve (server/ray_serve.py)."""
    from interlock.engine.load import check_before_loading
    from interlock.server.ray_serve import ReplicaConfig, run_replicas

    check_before_loading(args.model, args.tensor_parallel)       # here, not as N tracebacks in Ray's logs
    replicas = ReplicaConfig(min_replicas=args.replicas, max_replicas=max(args.max_replicas or 0, args.replicas),
                             cpus_per_replica=args.cpus_per_replica, graceful_shutdown_timeout_s=args.shutdown_timeout,
                             engine_options=engine_options(args))
    config, console = server_config(args), stderr_console()
    console.print(f"starting {replicas.min_replicas} replica(s) of {args.model} on Ray Serve ...")
    run_replicas(args.model, config, replicas, on_ready=lambda: console.print(
        f"interlock serve: {config.model_name} on http://{config.host}:{config.port}/v1 "
        f"({replicas.min_replicas}..{replicas.max_replicas} replicas on Ray Serve)"))


async def serve(args: argparse.Namespace) -> None:
    """The OpenAI-compatible server (interlock.server) over one engine, until SIGTERM / SIGINT."""
    from interlock.server import serve

    config, console = server_config(args), stderr_console()
    engine = load_engine(args, console)
    await serve(engine, config, log_level=args.log_level, on_ready=lambda: console.print(
        f"interlock serve: {config.model_name} on http://{config.host}:{config.port}/v1 "
        f"(speculative {args.speculative}, batch {args.max_batch_size})"))
