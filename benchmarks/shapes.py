"""`python -m interlock.benchmarks.shapes`: interlock against llama.cpp at real models' shapes.

    python -m interlock.benchmarks.shapes                      # Llama-3.2-1B's shape, int8 and int4
    python -m interlock.benchmarks.shapes --shapes 1b,3b,8b --weights int8 --tokens 32

Random weights in real shapes (benchmarks/shape_gguf.py writes them once, as GGUFs of llama.cpp's
Q8_0 and Q4_K_M type mixes, under `--files`, never in the repository): Llama-3.2-1B ("1b": 2048
wide, 16 layers, 32 / 8 heads, FFN 8192, 128,256 tokens, tied), Qwen2.5-3B ("3b": 2048, 36 layers,
16 / 2 heads, FFN 11008, 151,936 tokens, tied, q/k/v biases), Llama-3.1-8B ("8b": 4096, 32 layers,
32 / 8 heads, FFN 14336, 128,256 tokens, untied). Random weights say nothing about what a model
answers or how often speculation is accepted: only speed, start and memory mean anything here, and
speculation appears as the cost of its verify step.

Each system runs in a child process of its own (`--worker`), so its start time and peak RSS
(VmHWM: anonymous and file-backed pages, so llama.cpp's memory-mapped weights count as they are
touched) are its own. Each child's private writable memory is capped at what the machine had
available when the run began, less 1 GB (RLIMIT_DATA): a load that does not fit fails alone instead
of waking the OOM killer on a shared machine. Every system runs `--threads` threads (torch's
intra-op threads; llama.cpp's n_threads and n_threads_batch). The children stay loaded and take
one timed repeat per command, and the reference, llama.cpp Q4_K_M (the file people download), is
loaded beside each other system in turn and alternates with it, decode by decode and prefill by
prefill, so that load from other processes on a shared machine hits both sides of a ratio alike.
Each figure is given as the median and the best of `--repeats`, and each ratio as the median of
(repeat / the reference's repeat beside it) and as best / the reference's best: on a shared 2-core
machine one busy core slows a 2-thread repeat several times over (llama.cpp's spinning barriers
most), so the best repeat is the closest to what the code does on a quiet machine. "core share" =
the child's CPU seconds / (wall seconds x threads) over a repeat: under 1 means its threads
waited for a core (or, for interlock, sat idle while Python ran between ops); a repeat with a
share of at least 0.9 is "quiet", and the tables give the median of the quiet repeats too. While
fewer than half of a system's decode repeats (or the reference's beside them) were quiet, it
repeats past `--repeats`, up to `--max-repeats`.

- llama.cpp (llama-cpp-python built on this machine with its CPU backend; left out with
  `--skip-llama-cpp` or when not importable), each file: ready = the `Llama(...)` constructor
  (n_ctx 512 + N, the file memory-mapped and warm in the page cache: llama.cpp has no cache of
  its own); prefill tok/s = `--prompt` tokens / one `eval` of them into an empty cache; decode tok/s
  = (N - 1) / the time of N - 1 one-token `eval`s, each followed by the greedy argmax of its
  logits, after a 16-token prompt (N = `--tokens`).
- interlock, each file of `--interlock-files` and each kind of `--weights` (what `load_model(path,
  weights=...)` takes): cold ready = `load_model` in a child with a fresh XDG_CACHE_HOME (every
  per-model cache, weights and tokenizer, rebuilt; torch's extension cache, where the native
  kernels' one-off compile per machine and source version lives, is kept through
  TORCH_EXTENSIONS_DIR); ready = `load_model` in a second child with that cache filled, which then
  times the forward the engine runs (paged KV cache, `build_batch`): decode tok/s as model_speed's
  `run_ours` loop measures it (the same 16-token prompt and N tokens, batch building and argmax
  inside the timing), prefill tok/s of `--prompt` tokens in the engine's 256-token chunks
  (step_costs.prefill_tok_s), and, after `--prompt` tokens of context, a 1-row decode step and a
  K+1 = 4-row verify step alternating (4 x `--repeats` of each, timed as step_costs.step_s times
  them, batch building included, the cache rewound after each): their ratio is what a verify step
  costs against the decode step it replaces.
- The memory-bandwidth floor: this machine's stream bandwidth, measured in a child before and
  after each shape (the best of 5 full reads of a `--bandwidth-bytes` tensor, torch summing it as
  float32 and as int64, at each thread count up to `--threads`; the best of all), and the bytes
  one decode token reads: for llama.cpp every `blk.*` tensor of the file and its head
  (output.weight, or token_embd.weight when tied); for interlock every tensor its decode kernels
  read in each layer's linears and its head (a linear's buffers and parameters, less the bf16 copy
  the prompt GEMMs use, `dense_weight`, and a second copy of the same scales at another precision;
  a linear with a `decode_nbytes()` method says it itself). The embedding row and the KV cache
  (under 2% at these contexts) are left out. floor tok/s = bandwidth / bytes per token; "of floor"
  = decode tok/s / floor tok/s.

The raw results (every repeat, every child's report, the CPU, bandwidth, load averages) are saved
to `--out` (default benchmarks/results/shapes-<shapes>-<date>.json); the last line printed is one
JSON object. Figures from a shared 2-core machine are noisy: compare the columns of one run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from interlock.benchmarks.common import cpu_name, load_average, median, oversubscribed, print_json_last, print_table
from interlock.benchmarks.shape_gguf import FILE_TYPES, SHAPES, Shape, file_name, head_and_layer_bytes, write_gguf

RESULTS = Path(__file__).resolve().parent / "results"
FILES = Path("~/.cache/interlock/shapes").expanduser()
SHORT_PROMPT = 16                 # the decode runs' prompt
PROMPT_IDS = (17, 49152)          # prompt ids are drawn from the real tokenizer's ordinary tokens
REFERENCE_FILE = "Q4_K_M"
REFERENCE = f"llama.cpp {REFERENCE_FILE}"     # what the ratios divide by
METRICS = ("decode_tok_s", "prefill_tok_s")
QUIET = 0.9                       # a repeat whose core share is at least this had its cores


# --- the machine -------------------------------------------------------------------------------

def mem_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes, where Linux reports it."""
    try:
        line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024


def peak_rss() -> int:
    """This process's peak resident set in bytes (VmHWM; ru_maxrss where /proc is not there)."""
    try:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def torch_extensions_dir() -> str:
    """Where torch keeps (and finds) the extensions it builds, as torch.utils.cpp_extension resolves
    it: what a fresh XDG_CACHE_HOME would move, making a cold start recompile the native kernels."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return os.environ["TORCH_EXTENSIONS_DIR"]
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    accelerator = (f"rocm{torch.version.hip.replace('.', '')}" if torch.version.hip is not None else
                   f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda is not None else "cpu")
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return os.path.join(get_default_build_root(), f"{python}_{accelerator}")


# --- children: the parent's side ---------------------------------------------------------------

class WorkerError(RuntimeError):
    pass


class Worker:
    """A measurement child: it loads (its first reply says how it went), then answers one command a
    line ("decode", "prefill", "steps", "exit") with one JSON line each."""

    def __init__(self, spec: dict[str, Any], env: dict[str, str] | None = None, data_limit: int | None = None):
        def limit() -> None:
            if data_limit:
                resource.setrlimit(resource.RLIMIT_DATA, (data_limit, data_limit))

        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "interlock.benchmarks.shapes", "--worker", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
                                     env={**os.environ, **(env or {})}, preexec_fn=limit)
        try:
            self.info = self._reply()
        except BaseException:        # a failed load, or a stop while it loads: no orphan left behind
            self.kill()
            raise

    def _reply(self) -> dict[str, Any]:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if line:
            return json.loads(line)
        code = self.proc.wait()
        self.stderr.seek(0)
        tail = self.stderr.read()[-2000:]
        oom = " (killed: out of memory?)" if code in (-9, 137) else ""
        raise WorkerError(f"the child exited with status {code}{oom}: {tail.strip()[-600:]}")

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass                            # _reply reports why
        return self._reply()

    def close(self) -> dict[str, Any]:
        """Ends the child; its last report (peak RSS)."""
        final = self.ask("exit")
        self.proc.wait()
        self.stderr.close()
        return final

    def kill(self) -> None:
        """Ends the child if it still runs (after an error elsewhere); a no-op after close()."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


# --- children: the child's side ----------------------------------------------------------------

def worker_main(spec: dict[str, Any]) -> None:
    """Replies go to the original stdout only; anything else printed (C libraries, logs) goes to stderr."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def reply(obj: dict[str, Any]) -> None:
        replies.write(json.dumps(obj) + "\n")
        replies.flush()

    system = {"bandwidth": Bandwidth, "llama.cpp": LlamaCpp, "interlock": Interlock}[spec["kind"]](spec)
    reply(system.info)
    for line in sys.stdin:
        command = line.strip()
        if command == "exit":
            reply({"peak_rss_bytes": peak_rss()})
            return
        wall, cpu = time.perf_counter(), _cpu_s()
        result = getattr(system, command)()
        share = (_cpu_s() - cpu) / ((time.perf_counter() - wall) * spec.get("threads", 1))
        reply(result | {f"{command}_core_share": share})


def _cpu_s() -> float:
    """User + system CPU seconds of every thread of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _best_s(fn: Callable[[], object], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


class Bandwidth:
    def __init__(self, spec: dict[str, Any]) -> None:
        import torch

        x = torch.ones(spec["bytes"] // 4, dtype=torch.float32)
        reads = {"float32 sum": lambda: x.sum(), "int64 sum": lambda: x.view(torch.int64).sum()}
        times = {}
        for threads in range(1, spec["threads"] + 1):
            torch.set_num_threads(threads)
            times |= {f"{name}, {threads} threads": _best_s(fn, 5) for name, fn in reads.items()}
        best = min(times, key=times.get)
        self.info = {"bytes": x.numel() * 4, "bandwidth_b_s": x.numel() * 4 / times[best], "read": best,
                     "times_s": times}


class LlamaCpp:
    def __init__(self, spec: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        import llama_cpp
        import numpy as np

        import_s = time.perf_counter() - t0
        self.np, self.lib = np, llama_cpp
        self.prompt, self.short, self.n = spec["prompt"], spec["short"], spec["tokens"]
        start = time.perf_counter()
        self.llm = llama_cpp.Llama(model_path=spec["path"], n_ctx=512 + self.n, n_batch=512, n_threads=spec["threads"],
                                   n_threads_batch=spec["threads"], verbose=False)
        ready_s = time.perf_counter() - start
        self.n_vocab = self.llm.n_vocab()
        self.tokens: list[int] = []
        self.decode(), self.prefill()                # warm-up
        self.info = {"import_s": import_s, "ready_s": ready_s, "version": getattr(llama_cpp, "__version__", "?"),
                     "tokens": self.tokens,
                     "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()}

    def _greedy(self) -> int:
        logits = self.np.ctypeslib.as_array(self.lib.llama_get_logits_ith(self.llm.ctx, -1), shape=(self.n_vocab,))
        return int(self.np.argmax(logits))

    def decode(self) -> dict[str, Any]:
        self.llm.reset()
        self.llm.eval(self.short)
        out = [self._greedy()]
        start = time.perf_counter()
        for _ in range(self.n - 1):
            self.llm.eval([out[-1]])
            out.append(self._greedy())
        self.tokens = out
        return {"decode_tok_s": (self.n - 1) / (time.perf_counter() - start)}

    def prefill(self) -> dict[str, Any]:
        self.llm.reset()
        start = time.perf_counter()
        self.llm.eval(self.prompt)
        return {"prefill_tok_s": len(self.prompt) / (time.perf_counter() - start)}


PREFILL_ONLY = ("dense_weight",)      # the bf16 copy the prompt-chunk GEMMs read, not a decode step


def decode_nbytes(linear: Any) -> int:
    """The bytes a decode step reads from one linear (the module docstring says how they are counted)."""
    own = getattr(linear, "decode_nbytes", None)
    if callable(own):
        return int(own())
    tensors = dict(linear.named_buffers(recurse=False)) | dict(linear.named_parameters(recurse=False))
    if "scales_f32" in tensors:                  # Int8Linear: the same scales in bf16 and fp32
        tensors.pop("scales", None)
    return sum(t.numel() * t.element_size() for name, t in tensors.items()
               if t is not None and name not in PREFILL_ONLY)


class Interlock:
    def __init__(self, spec: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        import torch

        torch.set_num_threads(spec["threads"])
        from interlock.benchmarks import step_costs
        from interlock.benchmarks.model_speed import run_ours
        from interlock.kernels import native
        from interlock.models.loader import load_model

        import_s = time.perf_counter() - t0
        self.step_costs, self.run_ours = step_costs, run_ours
        self.short, self.n, self.context, self.repeats = spec["short"], spec["tokens"], len(spec["prompt"]), spec["repeats"]
        start = time.perf_counter()
        loaded = load_model(spec["path"], weights=spec["weights"])
        ready_s = time.perf_counter() - start
        self.model = model = loaded.model
        linears = [lin for layer in model._linears for lin in layer.values()] + [model._head]
        self.tokens: list[int] = []
        if spec["phase"] == "warm":
            self.decode(), self.prefill()            # warm-up
        self.info = {
            "import_s": import_s, "ready_s": ready_s, "bytes_per_token": sum(decode_nbytes(lin) for lin in linears),
            "linear_types": sorted({type(lin).__name__ for lin in linears}), "tokens": self.tokens,
            "kernel": native.int8_kernel(), "kv_dtype": model.config.cache_dtype, "torch": torch.__version__,
        }

    def decode(self) -> dict[str, Any]:
        run = self.run_ours(self.model, self.short, self.n)
        self.tokens = list(run.tokens)
        return {"decode_tok_s": (self.n - 1) / run.step_decode_s}

    def prefill(self) -> dict[str, Any]:
        return {"prefill_tok_s": self.step_costs.prefill_tok_s(self.model, self.context, 1)}

    def steps(self) -> dict[str, Any]:
        """A 1-row decode step and a 4-row verify step after `context` tokens, alternating (each
        timed with its batch building, the cache rewound after it), 4 x repeats of each."""
        import torch

        from interlock.models.batch import SeqChunk, build_batch
        from interlock.models.kv_cache import PagedKVCache

        model = self.model
        kv = PagedKVCache(model.config, num_blocks=-(-(self.context + 4) // 16) + 1, block_size=16)
        kv.add_sequence(0)
        ids = torch.randint(0, model.config.vocab_size, (self.context + 4,), generator=torch.Generator().manual_seed(0))
        prompt, new = tuple(ids[:self.context].tolist()), tuple(ids[self.context:].tolist())
        for offset in range(0, len(prompt), self.step_costs.PREFILL_CHUNK):
            part = prompt[offset: offset + self.step_costs.PREFILL_CHUNK]
            start = kv.reserve(0, len(part))
            model(build_batch([SeqChunk(0, part, start, (len(part) - 1,))], kv), kv)

        def step(rows: int) -> float:
            begin = time.perf_counter()
            start = kv.reserve(0, rows)
            model(build_batch([SeqChunk(0, new[:rows], start, tuple(range(rows)))], kv), kv)
            took = time.perf_counter() - begin
            kv.rewind(0, rows)
            return took

        step(1), step(4)
        pairs = [(step(1), step(4)) for _ in range(4 * self.repeats)]
        decode, verify = [p[0] * 1e3 for p in pairs], [p[1] * 1e3 for p in pairs]
        return {"decode_ms": median(decode), "verify4_ms": median(verify), "best_decode_ms": min(decode),
                "best_verify4_ms": min(verify), "verify4_over_decode": median([v / d for d, v in zip(decode, verify)]),
                "best_verify4_over_decode": min(verify) / min(decode)}


# --- the run -----------------------------------------------------------------------------------

def ensure_file(folder: Path, shape: Shape, file_type: str) -> tuple[Path, float]:
    """The shape's file of this type, written first if missing: (path, seconds spent writing)."""
    path = folder / file_name(shape, file_type)
    if path.is_file():
        return path, 0.0
    start = time.perf_counter()
    print(f"writing {path} ...", file=sys.stderr, flush=True)
    write_gguf(path, shape, file_type)
    return path, time.perf_counter() - start


def llama_cpp_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def prompt_ids(n: int, seed: int, vocab: int) -> list[int]:
    import numpy as np

    low, high = PROMPT_IDS
    return np.random.default_rng(seed).integers(min(low, vocab - 1), min(high, vocab), size=n).tolist()


def measure_bandwidth(threads: int, size: int, data_limit: int | None) -> dict[str, Any]:
    try:
        worker = Worker({"kind": "bandwidth", "threads": threads, "bytes": size}, None, data_limit)
    except WorkerError as exc:
        return {"error": str(exc), "bandwidth_b_s": 0.0}
    worker.close()
    return worker.info


class Runs:
    """Every system's repeats, and the reference's repeat beside each of them."""

    def __init__(self) -> None:
        self.systems: dict[str, dict[str, Any]] = {}

    def system(self, name: str, file_type: str) -> dict[str, Any]:
        return self.systems.setdefault(name, {"system": name, "file": file_type, "repeats": [], "paired_ref": []})

    def alternate(self, workers: dict[str, Worker], repeats: int, ref: Worker | None, max_repeats: int) -> None:
        """Rounds of each worker's decode and prefill, the reference's beside it, who goes first
        alternating: `repeats` of them, and more, up to `max_repeats`, until at least half of each
        worker's decode repeats were quiet (and the reference's beside them too)."""
        def quiet(name: str, side: str = "repeats") -> int:
            return sum(x["decode_core_share"] >= QUIET for x in self.systems[name][side])

        for r in range(max_repeats):
            if r >= repeats and all(2 * quiet(n) >= r and (ref is None or 2 * quiet(n, "paired_ref") >= r)
                                    for n in workers):
                break
            for name, worker in workers.items():
                pair = [worker] if ref is None else [worker, ref] if r % 2 == 0 else [ref, worker]
                got: dict[int, dict[str, Any]] = {id(w): {} for w in pair}
                for command in ("decode", "prefill"):
                    for w in pair:
                        got[id(w)] |= w.ask(command)
                self.systems[name]["repeats"].append(got[id(worker)])
                if ref is not None:
                    self.systems[name]["paired_ref"].append(got[id(ref)])
                    self.systems[REFERENCE]["repeats"].append(got[id(ref)])


def summarize(s: dict[str, Any], ref: dict[str, Any] | None, bandwidth: float) -> None:
    """Per metric: the median and the best repeat, the median of the paired ratios to the reference
    and the ratio of the bests; the floor; the median core share."""
    for metric in METRICS:
        values = [r[metric] for r in s["repeats"]]
        s[metric] = median(values) if values else None
        s[f"best_{metric}"] = max(values) if values else None
        if s["system"] == REFERENCE and values:
            s[f"{metric}_vs_ref"] = s[f"best_{metric}_vs_ref"] = 1.0
        elif s["paired_ref"]:
            s[f"{metric}_vs_ref"] = median([r[metric] / p[metric] for r, p in zip(s["repeats"], s["paired_ref"])])
            s[f"best_{metric}_vs_ref"] = max(values) / max(r[metric] for r in ref["repeats"]) if ref else None
        shares = [r[f"{metric.split('_')[0]}_core_share"] for r in s["repeats"]]
        s[f"{metric.split('_')[0]}_core_share"] = median(shares) if shares else None
        calm = [v for v, share in zip(values, shares) if share >= QUIET]
        s[f"quiet_{metric}"], s[f"quiet_{metric}_n"] = (median(calm) if calm else None), len(calm)
    if s.get("bytes_per_token") and bandwidth:
        s["floor_tok_s"] = bandwidth / s["bytes_per_token"]
        if s.get("decode_tok_s"):
            s["of_floor"] = s["decode_tok_s"] / s["floor_tok_s"]
            s["best_of_floor"] = s["best_decode_tok_s"] / s["floor_tok_s"]


def run_shape(key: str, args: argparse.Namespace, data_limit: int | None) -> dict[str, Any]:
    shape = SHAPES[key]
    needed = list(args.interlock_files) + ([] if args.skip_llama_cpp else list(args.llama_cpp_files))
    files = {ft: ensure_file(args.files, shape, ft) for ft in FILE_TYPES if ft in needed}
    common = {"threads": args.threads, "tokens": args.tokens, "repeats": args.repeats,
              "prompt": prompt_ids(args.prompt, 1, shape.vocab), "short": prompt_ids(SHORT_PROMPT, 2, shape.vocab)}
    env = {"OMP_NUM_THREADS": str(args.threads)}
    bandwidth = [measure_bandwidth(args.threads, args.bandwidth_bytes, data_limit)]
    runs = Runs()

    def fail(s: dict[str, Any], exc: Exception) -> None:
        s["error"] = str(exc)
        print(f"{s['system']} ({s['file']}) failed: {exc}", file=sys.stderr)

    ref: Worker | None = None
    if not args.skip_llama_cpp and REFERENCE_FILE in args.llama_cpp_files:
        s = runs.system(REFERENCE, REFERENCE_FILE)
        s["bytes_per_token"] = head_and_layer_bytes(files[REFERENCE_FILE][0])
        try:
            print(f"{key}: {REFERENCE} ...", file=sys.stderr, flush=True)
            ref = Worker({"kind": "llama.cpp", "path": str(files[REFERENCE_FILE][0]), **common}, env, data_limit)
            s["info"] = ref.info
        except WorkerError as exc:
            fail(s, exc)
    try:
        for ft in ([] if args.skip_llama_cpp else [f for f in args.llama_cpp_files if f != REFERENCE_FILE]):
            s = runs.system(f"llama.cpp {ft}", ft)
            s["bytes_per_token"] = head_and_layer_bytes(files[ft][0])
            print(f"{key}: llama.cpp {ft} ...", file=sys.stderr, flush=True)
            worker = None
            try:
                worker = Worker({"kind": "llama.cpp", "path": str(files[ft][0]), **common}, env, data_limit)
                s["info"] = worker.info
                runs.alternate({s["system"]: worker}, args.repeats, ref, args.max_repeats)
                s["info"] |= worker.close()
            except WorkerError as exc:
                fail(s, exc)
            finally:
                if worker is not None:
                    worker.kill()
        for ft in args.interlock_files:
            for weights in args.weights:
                s = runs.system(f"interlock {weights}", ft) if len(args.interlock_files) == 1 else \
                    runs.system(f"interlock {weights} ({ft})", ft)
                print(f"{key}: {s['system']} from {ft}: cold, then warm ...", file=sys.stderr, flush=True)
                cache = tempfile.mkdtemp(prefix="xdg-", dir=args.files)
                spec = {"kind": "interlock", "path": str(files[ft][0]), "weights": weights, **common}
                ienv = env | {"XDG_CACHE_HOME": cache, "TORCH_EXTENSIONS_DIR": torch_extensions_dir()}
                cold = worker = None
                try:
                    cold = Worker(spec | {"phase": "cold"}, ienv, data_limit)
                    s["cold"] = cold.info | cold.close()
                    worker = Worker(spec | {"phase": "warm"}, ienv, data_limit)
                    s["info"] = worker.info
                    s["bytes_per_token"] = worker.info["bytes_per_token"]
                    runs.alternate({s["system"]: worker}, args.repeats, ref, args.max_repeats)
                    s |= worker.ask("steps")
                    s["info"] |= worker.close()
                except WorkerError as exc:
                    fail(s, exc)
                finally:
                    for child in (cold, worker):
                        if child is not None:
                            child.kill()
                    shutil.rmtree(cache, ignore_errors=True)
        if ref is not None and not runs.systems[REFERENCE]["repeats"]:
            runs.alternate({REFERENCE: ref}, args.repeats, None, args.max_repeats)
        if ref is not None:
            runs.systems[REFERENCE]["info"] |= ref.close()
            ref = None
    finally:
        if ref is not None:
            ref.kill()
    bandwidth.append(measure_bandwidth(args.threads, args.bandwidth_bytes, data_limit))
    best = max(b.get("bandwidth_b_s", 0.0) for b in bandwidth)
    for s in runs.systems.values():
        summarize(s, runs.systems.get(REFERENCE), best)
    return {"shape": shape.__dict__, "bandwidth": bandwidth, "bandwidth_b_s": best,
            "files": {ft: {"path": str(p), "bytes": p.stat().st_size, "write_s": w} for ft, (p, w) in files.items()},
            "systems": list(runs.systems.values())}


def _gb(x: Any) -> Any:
    return None if x is None else x / 1e9


def print_shape(run: dict[str, Any], args: argparse.Namespace) -> None:
    rows, name = run["systems"], run["shape"]["name"]
    head = (f"{name} shape (random weights), {args.threads} threads, {args.repeats} repeats; vs {REFERENCE}: best / its "
            "best, and the median of the ratios to its repeat beside each")
    print_table(
        f"{head}; decode {args.tokens} tokens after {SHORT_PROMPT}; floor at {run['bandwidth_b_s'] / 1e9:.1f} GB/s",
        ["system", "file", "best tok/s", "quiet median", "quiet", "median", "vs ref (best)", "vs ref (paired)",
         "floor tok/s", "best of floor"],
        [[s["system"], s["file"], s.get("best_decode_tok_s"), s.get("quiet_decode_tok_s"),
          f"{s.get('quiet_decode_tok_s_n', 0)}/{len(s['repeats'])}", s.get("decode_tok_s"),
          s.get("best_decode_tok_s_vs_ref"), s.get("decode_tok_s_vs_ref"), s.get("floor_tok_s"), s.get("best_of_floor")]
         for s in rows])
    print_table(
        f"{name} shape: prefill of {args.prompt} tokens; a 4-row verify step against a 1-row decode step after "
        f"{args.prompt} tokens (median of the pairs' ratios, and the bests' ratio)",
        ["system", "file", "best tok/s", "quiet median", "quiet", "median", "vs ref (best)", "vs ref (paired)",
         "verify / decode", "(bests)"],
        [[s["system"], s["file"], s.get("best_prefill_tok_s"), s.get("quiet_prefill_tok_s"),
          f"{s.get('quiet_prefill_tok_s_n', 0)}/{len(s['repeats'])}", s.get("prefill_tok_s"),
          s.get("best_prefill_tok_s_vs_ref"), s.get("prefill_tok_s_vs_ref"), s.get("verify4_over_decode"),
          s.get("best_verify4_over_decode")] for s in rows])
    print_table(
        f"{name} shape: start and memory (interlock cold: a fresh XDG_CACHE_HOME)",
        ["system", "file", "ready s", "cold ready s", "peak RSS GB", "cold peak RSS GB", "MB read / token", "error"],
        [[s["system"], s["file"], s.get("info", {}).get("ready_s"), s.get("cold", {}).get("ready_s"),
          _gb(s.get("info", {}).get("peak_rss_bytes")), _gb(s.get("cold", {}).get("peak_rss_bytes")),
          None if s.get("bytes_per_token") is None else s["bytes_per_token"] / 1e6, (s.get("error") or "")[:60] or None]
         for s in rows])


def _list(choices: Sequence[str] | None) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in items if choices is not None and x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(choices or ['names'])}"
                                             f", got {text!r}")
        return items
    return parse


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", type=_list(list(SHAPES)), default=["1b"],
                   help="comma-separated: 1b (default), 3b, 8b (each takes longer: files of 2-9 GB, minutes per system)")
    p.add_argument("--weights", type=_list(None), default=["int8", "int4"],
                   help="interlock weight kinds, as load_model(weights=...) takes them (default int8,int4)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=64, help="decode tokens per repeat (N >= 2)")
    p.add_argument("--prompt", type=int, default=256, help="prefill prompt tokens, and the verify step's context")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats (medians and bests); the steps take 4x as many")
    p.add_argument("--max-repeats", type=int, default=None,
                   help="repeat past --repeats, up to this many, until half the decode repeats were quiet "
                        "(default 3 x --repeats)")
    p.add_argument("--interlock-files", type=_list(FILE_TYPES), default=["Q4_K_M"],
                   help="which files interlock reads (default Q4_K_M; Q4_K_M,Q8_0: twice the interlock time)")
    p.add_argument("--llama-cpp-files", type=_list(FILE_TYPES), default=list(FILE_TYPES))
    p.add_argument("--skip-llama-cpp", action="store_true")
    p.add_argument("--bandwidth-bytes", type=int, default=1 << 30, help="the stream read's size (default 1 GiB)")
    p.add_argument("--files", type=Path, default=FILES, help=f"where the GGUFs are written and kept (default {FILES})")
    p.add_argument("--out", type=Path, default=None, help="where to save the JSON (default benchmarks/results/)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.max_repeats = 3 * args.repeats if args.max_repeats is None else args.max_repeats
    if args.tokens < 2 or args.threads < 1 or args.repeats < 1 or args.prompt < 1 or args.max_repeats < args.repeats:
        p.error("need --tokens >= 2, --threads >= 1, --repeats >= 1, --prompt >= 1, --max-repeats >= --repeats")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker:
        worker_main(json.loads(args.worker))
        return
    # A SIGTERM (a job runner's stop) unwinds like an exception, so the children are killed and the
    # temporary caches (a converted model each, gigabytes) removed by the `finally` blocks.
    def stop(signum: int, frame: object) -> None:
        print(f"stopped by signal {signum}: ending the children", file=sys.stderr, flush=True)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    if not args.skip_llama_cpp and not llama_cpp_importable():
        print("llama-cpp-python is not importable (pip install 'interlock[peers]', built on this machine); "
              "llama.cpp skipped", file=sys.stderr)
        args.skip_llama_cpp = True
    args.files.mkdir(parents=True, exist_ok=True)
    available = mem_available()
    data_limit = None if available is None else max(1 << 30, available - (1 << 30))
    load_before, busy = load_average(), oversubscribed(args.threads)
    runs = {}
    for key in args.shapes:
        runs[key] = run_shape(key, args, data_limit)
        print_shape(runs[key], args)
    load_after = load_average()
    result = {
        "cpu": cpu_name(), "threads": args.threads, "tokens": args.tokens, "prompt": args.prompt,
        "repeats": args.repeats, "weights": args.weights, "mem_available_bytes": available,
        "python": platform.python_version(), "date": datetime.date.today().isoformat(),
        "loadavg_before": load_before, "loadavg_after": load_after, "oversubscribed": busy, "shapes": runs,
    }
    out = args.out or RESULTS / f"shapes-{'-'.join(args.shapes)}-{datetime.date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"CPU {result['cpu']}; load average {load_before} -> {load_after}; saved {out}")
    if busy:
        print(f"warning: load average + {args.threads} threads exceed the {os.cpu_count()} cores: "
              "timings include waiting for a core")
    summary: dict[str, Any] = {"file": str(out), "cpu": result["cpu"]}
    for key, run in runs.items():
        summary[f"{key} bandwidth_gb_s"] = round(run["bandwidth_b_s"] / 1e9, 2)
        for s in run["systems"]:
            name = f"{key} {s['system']}" + ("" if s["system"].endswith(s["file"]) else f" {s['file']}")
            keys = [f"{b}{m}{v}" for m in METRICS for b in ("", "best_") for v in ("", "_vs_ref")]
            keys += [f"quiet_{m}" for m in METRICS]
            values = {**{k: s.get(k) for k in (*keys, "of_floor", "best_of_floor", "verify4_over_decode",
                                               "best_verify4_over_decode")},
                      "ready_s": s.get("info", {}).get("ready_s"), "cold_ready_s": s.get("cold", {}).get("ready_s"),
                      "peak_rss_gb": _gb(s.get("info", {}).get("peak_rss_bytes"))}
            summary |= {f"{name} {k}": round(v, 3) for k, v in values.items() if v is not None}
            if s.get("error"):
                summary[f"{name} error"] = s["error"][:200]
    print_json_last(summary)


if __name__ == "__main__":
    main()
