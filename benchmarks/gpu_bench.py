"""The GPU path measured: a whole speculative step as one program on the CUDA timeline.

Run on a CUDA machine (random weights of real shapes, drawn on the GPU; no checkpoint):
    python -m interlock.benchmarks.gpu_bench [--out FILE] [--quick]      (make gpu-check runs it)

One step, for B requests with n-gram-style point-mass drafts of length K = 3:
- model lane: async H2D of the step's token ids, drafts and uniforms from pinned buffers, target
  forward over B*(K+1) rows (models/device_llama.py), wait for the mask event, mask apply (Triton),
  probabilities, rejection sampling (Triton), async D2H of the tokens, a host function that
  delivers them and stages the next step's inputs into the pinned buffers, token event. (Staging
  at the head of the step instead costs the whole mask fill: the driver runs host functions one
  at a time, so the model lane's staging waited behind the grammar lane's fill before the forward
  could start. At the tail, the fill overlaps the forward.);
- grammar lane (constrained runs only): a host function with the engine's xgrammar matchers (a JSON
  schema) and its batched pass (grammars/batch.py) checks the drafts, fills K+1 bitmask rows per
  request into a pinned buffer and commits the step's tokens, async H2D, mask event.
The tokens each request commits follow a fixed valid JSON document (random weights sample
nonsense, so the sampled tokens are delivered but not fed back): every step does the grammar work
of a step whose K drafts are all accepted. The vocabulary is the SmolLM2 tokenizer's 49,152
byte-level tokens extended to 128,256 with concatenations of pairs of its tokens (a BPE vocabulary
grows by such merges: mask_bench.wide_tokenizer), so xgrammar masks a Llama-3-sized vocabulary.

Measured (median of repeats; ms): (a) captured step time constrained vs unconstrained at batch 1
and 32 for a Llama-3-8B-shaped and a Llama-3.2-1B-shaped model; (b) eager vs captured; (c) the
rejection kernel at B=64, K=5, V=128256; (d) the mask kernel per row at V=128256; (e) exposed
grammar time per step (constrained - unconstrained captured step time) next to the grammar host
function's own time; (f) the cost of batch invariance (padded GEMMs + per-row kernels) per forward.
Writes the JSON results (with the delivered token ids), then prints the table last.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch

from interlock.kernels.bitmask import apply_token_bitmask_
from interlock.kernels.rejection import rejection_sample
from interlock.kernels.sampling import probs_from_logits
from interlock.models.config import ModelConfig
from interlock.models.kv_cache import PagedKVCache

VOCAB = 128256
K = 3
PROMPT = 256
BLOCK = 16
SHAPES = {
    "llama3-8b": ModelConfig(vocab_size=VOCAB, hidden_size=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                             intermediate_size=14336, rope_theta=500000.0, max_position=4096, dtype="bfloat16"),
    "llama3.2-1b": ModelConfig(vocab_size=VOCAB, hidden_size=2048, n_layers=16, n_heads=32, n_kv_heads=8,
                               intermediate_size=8192, head_dim=64, rope_theta=500000.0, max_position=4096,
                               tie_embeddings=True, dtype="bfloat16"),
}
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"}, "name": {"type": "string"}, "email": {"type": "string"},
        "active": {"type": "boolean"}, "score": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                                      "zip": {"type": "string"}},
                    "required": ["street", "city", "zip"]},
    },
    "required": ["id", "name", "email", "active", "score", "tags", "address"],
}


def document(i: int) -> str:
    """A valid instance of SCHEMA; varied per request."""
    return json.dumps({"id": 1000 + i, "name": f"Ada Lovelace {i}", "email": f"ada{i}@example.org",
                       "active": i % 2 == 0, "score": 3.25 + i, "tags": ["math", "engines", f"note {i}"],
                       "address": {"street": f"{12 + i} St James's Square", "city": "London", "zip": "SW1Y 4JH"}})


# --- grammar lane state ----------------------------------------------------------------------

class GrammarHost:
    """The grammar lane's host state: one of the engine's xgrammar matchers per request, its token
    script, and the engine's batched pass over them (grammars/batch.py: check, K+1 rows, commit)."""

    def __init__(self, batch: int, threads: int = 8) -> None:
        from interlock.benchmarks.mask_bench import wide_embedded_tokenizer
        from interlock.grammars import make_backend
        from interlock.grammars.batch import StepMasks
        from interlock.protocol.grammar import JsonSchema

        tok = wide_embedded_tokenizer(VOCAB)
        backend = make_backend("xgrammar", tok, VOCAB)
        start = time.perf_counter()
        compiled = backend.compile(JsonSchema(SCHEMA))
        self.compile_s = time.perf_counter() - start
        self.scripts = [tok.encode(json.dumps(json.loads(document(i)), separators=(",", ":"))) for i in range(batch)]
        self.matchers = [backend.matcher(compiled) for _ in range(batch)]
        self.masks = StepMasks(threads)
        self.pointers = [0] * batch
        for m, s in zip(self.matchers, self.scripts):
            if not m.accept(s[:1]):
                raise RuntimeError("the script's first token is not valid JSON for the schema")
        self.fill_seconds: collections.deque[float] = collections.deque(maxlen=4096)
        self.refused = 0                                # script tokens a matcher refused (expect 0)

    def step(self, bitmask: torch.Tensor) -> None:
        """Host function: check the K script drafts, fill K+1 rows per request, commit K+1 tokens."""
        from interlock.grammars.batch import Drafted

        start = time.perf_counter()
        for b, m in enumerate(self.matchers):           # near the end of the document: start over
            if self.pointers[b] + 2 * (K + 1) >= len(self.scripts[b]):
                m.reset()
                m.accept(self.scripts[b][:1])
                self.pointers[b] = 0
        drafts = [tuple(s[p + 1: p + K + 1]) for s, p in zip(self.scripts, self.pointers)]
        requests = [Drafted(m, d, b * (K + 1)) for b, (m, d) in enumerate(zip(self.matchers, drafts))]
        cuts = self.masks.check(requests, bitmask)
        self.masks.fill([Drafted(m, d[:n], b * (K + 1)) for b, (m, d, n) in
                         enumerate(zip(self.matchers, drafts, cuts))], bitmask)
        tokens = [s[p + 1: p + K + 2] for s, p in zip(self.scripts, self.pointers)]
        self.refused += sum(not ok for ok in self.masks.commit(self.matchers, tokens))
        self.refused += sum(K - n for n in cuts)
        self.pointers = [p + K + 1 for p in self.pointers]
        self.fill_seconds.append(time.perf_counter() - start)


# --- the step program --------------------------------------------------------------------------

class Step:
    """Persistent buffers of one (model, batch) and the ops of one speculative step."""

    def __init__(self, timeline, model, kv: PagedKVCache, scripts: list[list[int]], grammar: GrammarHost | None) -> None:
        from interlock.models.device_llama import step_inputs
        from interlock.models.batch import SeqChunk

        self.timeline, self.model, self.kv, self.grammar, self.scripts = timeline, model, kv, grammar, scripts
        b = len(scripts)
        self.batch = b
        chunks = [SeqChunk(s, (0,) * (K + 1), PROMPT, tuple(range(K + 1))) for s in range(b)]
        self.inputs = step_inputs(chunks, kv, max_blocks=-(-(PROMPT + K + 1) // BLOCK))
        pin = {"pin_memory": True}
        self.ids_host = torch.zeros(b * (K + 1), dtype=torch.int64, **pin)
        self.drafts_host = torch.zeros(b, K, dtype=torch.int64, **pin)
        self.u_host = torch.zeros(b, K + 1, **pin)
        self.drafts = torch.zeros(b, K, dtype=torch.int64, device="cuda")
        self.u = torch.zeros(b, K + 1, device="cuda")
        self.n = torch.full((b,), K, dtype=torch.int64, device="cuda")
        self.temperature = torch.ones(b * (K + 1), device="cuda")
        words = -(-VOCAB // 32)
        self.mask_host = torch.zeros(b * (K + 1), words, dtype=torch.int32, **pin)
        self.mask = torch.zeros(b * (K + 1), words, dtype=torch.int32, device="cuda")
        self.tokens_host = torch.zeros(b, K + 1, dtype=torch.int64, **pin)
        self.accepted_host = torch.zeros(b, dtype=torch.int64, **pin)
        self.delivered: collections.deque[list[int]] = collections.deque(maxlen=64)
        self.pointers = [0] * b
        self.gen = torch.Generator().manual_seed(1)
        self.mask_event, self.token_event = timeline.new_event(), timeline.new_event()
        self.stage()                # the first step's inputs; later ones are staged at each step's tail

    # host functions (no CUDA calls: pinned CPU tensors only)
    def stage(self) -> None:
        for b, s in enumerate(self.scripts):
            p = self.pointers[b]
            self.ids_host[b * (K + 1): (b + 1) * (K + 1)] = torch.tensor(s[p: p + K + 1])
            self.drafts_host[b] = torch.tensor(s[p + 1: p + K + 1])
            self.pointers[b] = 0 if p + 2 * (K + 1) >= len(s) else p + K + 1
        torch.rand(self.u_host.shape, generator=self.gen, out=self.u_host)

    def deliver_and_stage(self) -> None:
        """The step's tail: hand the tokens over, then stage the next step's inputs (which a real
        step derives from the accepted tokens: next token, n-gram drafts)."""
        self.delivered.append(self.tokens_host[0].tolist() + [int(self.accepted_host[0])])
        self.stage()

    # device work
    def h2d(self) -> None:
        self.inputs.input_ids.copy_(self.ids_host, non_blocking=True)
        self.drafts.copy_(self.drafts_host, non_blocking=True)
        self.u.copy_(self.u_host, non_blocking=True)

    def verify(self) -> None:
        b, v = self.batch, VOCAB
        if self.grammar is not None:
            apply_token_bitmask_(self.logits, self.mask, backend="cuda")
        probs = probs_from_logits(self.logits, self.temperature)
        result = rejection_sample(probs.view(b, K + 1, v), self.drafts, None, self.n, self.u, backend="cuda")
        self.tokens_host.copy_(result.tokens, non_blocking=True)
        self.accepted_host.copy_(result.num_accepted, non_blocking=True)

    def forward(self) -> None:
        self.logits = self.model(self.inputs, self.kv)

    def enqueue(self) -> None:
        """One step's ops on the two lanes (what a capture records)."""
        g, m = self.timeline.grammar, self.timeline.model
        if self.grammar is not None:
            g.wait(self.token_event)
            g.launch_host(self.grammar.step, self.mask_host)
            g.launch(lambda: self.mask.copy_(self.mask_host, non_blocking=True))
            g.record(self.mask_event)
        m.launch(self.h2d)          # inputs staged by the previous step's tail (or before the first)
        m.launch(self.forward)
        if self.grammar is not None:
            m.wait(self.mask_event)
        m.launch(self.verify)
        m.launch_host(self.deliver_and_stage)
        m.record(self.token_event)


def per_step_ms(run: Callable[[], None], steps: int, repeats: int = 5) -> float:
    """Median over repeats of (wall time of `steps` back-to-back runs + final sync) / steps."""
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(times)


def make_cache(config: ModelConfig, batch: int) -> PagedKVCache:
    per_seq = -(-(PROMPT + K + 1) // BLOCK)
    kv = PagedKVCache(config, num_blocks=batch * per_seq + 1, block_size=BLOCK, device="cuda")
    kv.k.normal_()
    kv.v.normal_()
    kv.add_sequence(-1)
    kv.reserve(-1, 1)                                   # block 0 (allocated first) for padding rows
    for s in range(batch):
        kv.add_sequence(s)
        kv.reserve(s, PROMPT + K + 1)
    return kv


def bench_steps(name: str, model, batch: int, steps: int, threads: int) -> dict[str, object]:
    from interlock.streams.cuda_timeline import CudaTimeline

    grammar = GrammarHost(batch, threads)
    kv = make_cache(SHAPES[name], batch)
    out: dict[str, object] = {"model": name, "batch": batch, "grammar_threads": threads,
                              "grammar_compile_s": grammar.compile_s}
    with CudaTimeline() as tl:
        for label, g in (("unconstrained", None), ("constrained", grammar)):
            step = Step(tl, model, kv, grammar.scripts, g)
            out[f"eager_{label}_ms"] = per_step_ms(step.enqueue, steps)
            with tl.capture() as program:
                step.enqueue()
            out[f"captured_{label}_ms"] = per_step_ms(lambda: tl.replay(program), steps)
            out[f"tokens_{label}"] = list(step.delivered)[-4:]
            program.close()
    fills = sorted(grammar.fill_seconds)
    out["grammar_host_fn_ms"] = 1e3 * fills[len(fills) // 2]
    out["grammar_refused_tokens"] = grammar.refused
    out["grammar_overhead_frac"] = out["captured_constrained_ms"] / out["captured_unconstrained_ms"] - 1
    out["exposed_grammar_ms"] = out["captured_constrained_ms"] - out["captured_unconstrained_ms"]
    return out


def bench_invariance(name: str, model, batch: int) -> dict[str, object]:
    """Forward time (captured) with and without the batch-invariant path."""
    from interlock.models.batch import SeqChunk
    from interlock.models.device_llama import step_inputs

    kv = make_cache(SHAPES[name], batch)
    chunks = [SeqChunk(s, (5,) * (K + 1), PROMPT, ()) for s in range(batch)]
    inputs = step_inputs(chunks, kv, max_blocks=-(-(PROMPT + K + 1) // BLOCK))
    res: dict[str, object] = {"model": name, "batch": batch}
    for invariant in (True, False):
        model.invariant = invariant
        graph = _capture(lambda: model(inputs, kv))
        res["forward_invariant_ms" if invariant else "forward_plain_ms"] = per_step_ms(graph.replay, 20)
    model.invariant = True
    res["invariant_cost_frac"] = res["forward_invariant_ms"] / res["forward_plain_ms"] - 1
    return res


def _capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()                                            # warm-up: Triton compiles outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def bench_kernels() -> dict[str, float]:
    from triton.testing import do_bench

    gen = torch.Generator(device="cuda").manual_seed(0)
    b, k, v = 64, 5, VOCAB
    p = torch.softmax(torch.randn(b, k + 1, v, device="cuda", generator=gen) * 3, -1)
    d = p[:, :k].argmax(-1)
    d[::2, 2] = 7
    n = torch.full((b,), k, device="cuda")
    u = torch.rand(b, k + 1, device="cuda", generator=gen)
    res = {
        "rejection_cuda_ms": do_bench(lambda: rejection_sample(p, d, None, n, u, backend="cuda"), return_mode="median"),
        "rejection_torch_ms": do_bench(lambda: rejection_sample(p, d, None, n, u, backend="torch"), return_mode="median"),
    }
    rows = 128
    bits = torch.randint(-2**31, 2**31 - 1, (rows, -(-v // 32)), dtype=torch.int32, device="cuda", generator=gen)
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(rows, v, device="cuda", generator=gen).to(dtype)
        tag = str(dtype).removeprefix("torch.")
        for backend in ("cuda", "torch"):
            ms = do_bench(lambda: apply_token_bitmask_(logits, bits, backend=backend), return_mode="median")
            res[f"mask_{backend}_{tag}_us_per_row"] = ms * 1e3 / rows
    return res


def device_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, check=True).stdout.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return torch.cuda.get_device_name()


def main() -> None:
    from interlock.models.device_llama import DeviceLlama

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="results JSON (default benchmarks/results/gpu-DATE.json)")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--grammar-threads", type=int, default=None,
                        help="the batched pass's threads (default: GrammarConfig.mask_threads' default)")
    parser.add_argument("--quick", action="store_true", help="the 1B shape only, batch 1 (a smoke test)")
    args = parser.parse_args()
    today = datetime.date.today().isoformat()
    out_path = Path(args.out or Path(__file__).parent / "results" / f"gpu-{today}.json")
    results: dict[str, object] = {"device": device_name(), "date": today, "torch": torch.__version__,
                                  "draft_len": K, "prompt_len": PROMPT, "vocab": VOCAB, "steps": []}
    save = lambda: (out_path.parent.mkdir(parents=True, exist_ok=True),  # noqa: E731 - partial results survive a crash
                    out_path.write_text(json.dumps(results, indent=1)))
    results["kernels"] = bench_kernels()
    save()
    shapes = ["llama3.2-1b"] if args.quick else ["llama3-8b", "llama3.2-1b"]
    for name in shapes:
        model = DeviceLlama.random(SHAPES[name], seed=0)
        for batch in ([1] if args.quick else [1, 32]):
            try:
                results["steps"].append(bench_steps(name, model, batch, args.steps, args.grammar_threads))
                results.setdefault("invariance", []).append(bench_invariance(name, model, batch))
            except Exception as exc:  # noqa: BLE001 - record it, measure the other shapes
                results.setdefault("errors", []).append(f"{name} B={batch}: {exc!r}")
            print(json.dumps(results["steps"][-1:]), flush=True)
            save()
        del model
        torch.cuda.empty_cache()
    headline = [s for s in results["steps"] if s["model"] == shapes[0] and s["batch"] == 1]
    results["grammar_overhead_frac"] = headline[0]["grammar_overhead_frac"] if headline else None
    save()
    print_table(results)


def print_table(r: dict[str, object]) -> None:
    print(f"\ndevice: {r['device']}  K={K}  prompt={PROMPT}  vocab={VOCAB}")
    print(f"{'model':<12} {'B':>3} {'eager U':>9} {'eager C':>9} {'graph U':>9} {'graph C':>9} {'overhead':>9} "
          f"{'exposed':>8} {'gram fn':>8}")
    for s in r["steps"]:
        print(f"{s['model']:<12} {s['batch']:>3} {s['eager_unconstrained_ms']:>9.3f} {s['eager_constrained_ms']:>9.3f} "
              f"{s['captured_unconstrained_ms']:>9.3f} {s['captured_constrained_ms']:>9.3f} "
              f"{100 * s['grammar_overhead_frac']:>8.1f}% {s['exposed_grammar_ms']:>8.3f} {s['grammar_host_fn_ms']:>8.3f}")
    for s in r.get("invariance", []):
        print(f"invariance {s['model']:<12} B={s['batch']:<3} forward {s['forward_invariant_ms']:.3f} ms vs plain "
              f"{s['forward_plain_ms']:.3f} ms ({100 * s['invariant_cost_frac']:+.1f}%)")
    kern = r["kernels"]
    print(f"rejection B=64 K=5 V=128256: cuda {kern['rejection_cuda_ms']:.4f} ms, torch {kern['rejection_torch_ms']:.4f} ms")
    print(f"mask per row V=128256: cuda fp32 {kern['mask_cuda_float32_us_per_row']:.3f} us, bf16 "
          f"{kern['mask_cuda_bfloat16_us_per_row']:.3f} us; torch fp32 {kern['mask_torch_float32_us_per_row']:.3f} us")
    print(f"grammar_overhead_frac ({r['steps'][0]['model'] if r['steps'] else '-'}, batch 1, captured): "
          f"{r['grammar_overhead_frac']}")
    for e in r.get("errors", []):
        print("ERROR", e)


if __name__ == "__main__":
    main()
