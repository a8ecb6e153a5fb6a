"""The `interlock` command's flags. Each value is checked where argparse reads it, so a bad one is
a usage error naming its flag (exit 2), before any model loads, never a traceback after."""
from __future__ import annotations

import argparse
from pathlib import Path

from interlock.benchmarks.prompts import dataset_arg
from interlock.protocol.grammar import BACKENDS, DEFAULT_BACKEND
from interlock.protocol.speculative import DEFAULT_DRAFT_LEN, DEFAULT_SPECULATIVE, MAX_DRAFT_LEN
from interlock.protocol.types import DEFAULT_PREFILL, DEVICE_PATTERN, DTYPES, PREFILL_MODES, SIMD_CPUS
from interlock.models.names import EMBEDDED

LOG_LEVELS = ("debug", "info", "warning", "error")
WEIGHTS = ("auto", "int4", "int8", "float")         # models.linear.WeightsChoice

MODEL_HELP = (f"{EMBEDDED} (embedded), a .gguf file, an HF checkpoint folder or a Hugging Face hub id "
              "such as Qwen/Qwen2.5-0.5B-Instruct (HF_HUB_OFFLINE=1: from the local cache only)")
SPECULATIVE_HELP = ("none, or drafters joined by +: ngram[:N], suffix, forced[:N] (N forced rows beyond --draft-len, "
                    "4 by default), self-draft[:N], draft:PATH; options: adaptive, nomask (no draft-side grammar "
                    "masking), e.g. ngram+forced+adaptive or self-draft+forced")
TP_HELP = ("N > 1: the model's forward on N worker processes (torch.distributed gloo), each holding 1/N of "
           "the weights; N must divide the model's heads, KV heads and MLP width")


def flag(dest: str) -> str:
    """The flag of an option's dest (or of the library field it sets): every option is its name with dashes."""
    return "--" + dest.replace("_", "-")


def _device(text: str) -> str:
    """--device: cpu, cuda, cuda:N or auto (EngineConfig.device), a usage error otherwise."""
    if not DEVICE_PATTERN.match(text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda, cuda:N or auto, got {text!r}")
    return text


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


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


def _queue(text: str) -> int:
    """--max-queue: 0 or more."""
    return 0 if text.strip() == "0" else _positive_int(text)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port in 0..65535, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 0..65535, got {value}")
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
    parser.add_argument("--log-level", default="warning", choices=LOG_LEVELS,
                        help="interlock's events on stderr from this level up; info: the model loaded, the engine "
                             "started, one line per finished request")
    parser.add_argument("--threads", type=_positive_int, default=None,
                        help="torch intra-op threads of the model lane (default: min(2, cores); every other "
                             "thread runs torch at 1)")
    parser.add_argument("--device", type=_device, default="cpu",
                        help="where the model runs: cpu (default), cuda, cuda:N, or auto (CUDA when torch sees "
                             "one); on CUDA the weights are bf16 and steps are CUDA graphs (docs/gpu.md)")
    parser.add_argument("--prefill", default=DEFAULT_PREFILL, choices=PREFILL_MODES,
                        help="how prompt chunks are computed (EngineConfig.prefill): rows (int8, batch invariant: "
                             "prefix-cache hits at any block), dense (bf16, unquantized weights), auto (rows "
                             f"where the CPU has {SIMD_CPUS})")
    parser.add_argument("--weights", default="auto", choices=WEIGHTS,
                        help="how the CPU forward holds the weights (load_model's weights): auto is int4 for a "
                             "4-bit GGUF (Q4_0, Q4_1, Q4_K_M: ~4.8 bits a weight, the fewest bytes a decode step "
                             "reads) and int8 for everything else; float keeps the checkpoint's values (the "
                             "reference, 4 bytes a weight); the device runner (CUDA) always runs bf16")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", *DTYPES],
                        help="what the KV cache stores (load_model's kv_dtype): auto is float16 beside int8 "
                             f"weights where the CPU has {SIMD_CPUS} (half the bytes a long context's step "
                             "reads), else float32")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, max_tokens: int) -> None:
        p.add_argument("--model", default=EMBEDDED, help=MODEL_HELP)
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
    gen.add_argument("--raw", action="store_true",
                     help="send the prompt as text (with the BOS the model adds to a text), not as a chat "
                          "message; the default for a model without a chat template")
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--law", choices=("masked", "conditional"), default="masked",
                     help="masked: each token from the grammar-masked model (the default); conditional: exact "
                          "samples of the model's law conditioned on the whole output matching the grammar, by "
                          "attempts (needs a grammar and --temperature > 0; prints once accepted)")
    gen.add_argument("--max-attempts", type=int, default=64, help="--law conditional: attempts before giving up")
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
    bench.add_argument("--dataset", type=dataset_arg, required=True,
                       help="a JSONSchemaBench set's name (JME) or file name (JME.jsonl), looked up in the vendored "
                            "tests/data/jsonschemabench, then $INTERLOCK_DATA, then ../shared/data/jsonschemabench; "
                            "or a path to a .jsonl file")
    bench.add_argument("--limit", type=_positive_int)
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
    bench.add_argument("--json", action="store_true",
                       help="the results as JSON on stdout (token ids included); the tables go to stderr")
    bench.add_argument("--out", metavar="FILE", help="write the results as JSON to FILE (token ids included)")
    bench.add_argument("--prefix-caching", choices=["on", "off", "both"], default="on",
                       help="share cached prompt blocks between requests; both: run each mode with, then without")
    common(bench, 256)
    srv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (chat/completions, structured outputs, "
                                       "tools, SSE, /metrics)")
    srv.add_argument("--model", default=EMBEDDED, help=MODEL_HELP)
    srv.add_argument("--served-model-name", default=None, help="the `model` id clients send (default: --model)")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=_port, default=8000)
    srv.add_argument("--speculative", type=_speculative, default=DEFAULT_SPECULATIVE,
                     help="as for generate; fixed for every request")
    srv.add_argument("--draft-len", type=_draft_len, default=DEFAULT_DRAFT_LEN)
    srv.add_argument("--backend", default=DEFAULT_BACKEND, choices=BACKENDS)
    srv.add_argument("--max-batch-size", type=_positive_int, default=8)
    srv.add_argument("--max-queue", type=_queue, default=64,
                     help="requests admitted beyond the batch; past it the server answers 429 with Retry-After")
    srv.add_argument("--max-tokens", type=_positive_int, default=256, help="for requests that give no max_tokens")
    srv.add_argument("--max-body-bytes", type=_positive_int, default=1 << 20)
    srv.add_argument("--reasoning", action="store_true",
                     help="chat outputs think freely up to </think>, then follow the request's grammar; "
                          "the thinking is returned as reasoning_content")
    srv.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1/*")
    srv.add_argument("--shutdown-timeout", type=_positive_float, default=10.0,
                     help="seconds requests in flight get to finish after SIGTERM/SIGINT")
    srv.add_argument("--access-log", action="store_true",
                     help="uvicorn's access log on stderr: one line per HTTP request")
    srv.add_argument("--tensor-parallel", type=_positive_int, default=1, help=TP_HELP)
    srv.add_argument("--device", type=_device, default=argparse.SUPPRESS,
                     help="as the global --device (interlock --device cuda serve), given after serve")
    srv.add_argument("--replicas", type=_positive_int, default=None,
                     help="N engine replicas behind Ray Serve's proxy (needs the [cluster] extra; joins the "
                          "cluster in RAY_ADDRESS if set, else starts a local Ray)")
    srv.add_argument("--max-replicas", type=_positive_int, default=None,
                     help="with --replicas: autoscale up to this many")
    srv.add_argument("--cpus-per-replica", type=_positive_float, default=1.0)
    return parser
