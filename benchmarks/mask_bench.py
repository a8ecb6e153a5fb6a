"""`python -m interlock.benchmarks.mask_bench`: a step's grammar host work, per-row vs batched.

One step of B constrained requests with K = 3 drafts each, as the GrammarActor does it: the draft
check (cut at the first refused draft), the K+1 mask rows, and the commit of the accepted drafts
plus one more token. Two paths, timed side by side on the same requests:
- per-row: each matcher's own validate, fill_masks and accept (what the engine did before
  grammars/batch.py; `RowByRow`);
- batched: `StepMasks` at 1, 2, 4, 8 and 16 threads (xgrammar's BatchGrammarMatcher,
  llguidance's parallel draft fill).

Requests replay valid instances of JSONSchemaBench schemas (JME and Github_easy, the first
--schemas of each that the backend compiles and whose instance it accepts, compact JSON); every
fourth request's second draft is replaced by EOS, which the grammar refuses mid-output: the check cuts.
Both vocabularies: SmolLM2's 49,152 ids, and 128,256 ids built as gpu_bench's GrammarHost builds
them (SmolLM2's tokens plus concatenations of two of them, seed 0). Each path must produce the
same cuts, rows and verdicts (a digest per step); the table gives median ms per step and the
per-row / batched ratio. Raw results (per-step times, the scripts' token ids) go to
benchmarks/results/.

    python -m interlock.benchmarks.mask_bench [--quick] [--model FILE] [--data DIR] [--out FILE]
The data: --data, else $INTERLOCK_DATA, else ../shared/data/jsonschemabench beside the checkout.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch

from interlock.benchmarks.common import load_average, median, print_json_last, print_table
from interlock.benchmarks.prompts import full_sets, load_rows
from interlock.grammars import make_backend
from interlock.grammars.batch import Drafted, RowByRow, StepMasks
from interlock.grammars.bitmask import allocate_bitmask
from interlock.logs import configure_logging
from interlock.models.loader import EMBEDDED, load_tokenizer
from interlock.models.tokenizer import Tokenizer
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import JsonSchema

RESULTS = Path(__file__).resolve().parent / "results"
K = 3
WIDE = 128256                   # gpu_bench's VOCAB (Llama 3)
DATASET_FILES = ("JME.jsonl", "Github_easy.jsonl")


def wide_tokenizer(base: Tokenizer, size: int = WIDE) -> Tokenizer:
    """base's BPE plus merges of two random tokens until `size` ids (gpu_bench's construction)."""
    from tokenizers import Tokenizer as RawTokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(base.hf.backend_tokenizer.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    gen = torch.Generator().manual_seed(0)
    merges = spec["model"]["merges"]
    while len(vocab) < size:
        a, b = torch.randint(256, len(tokens), (2,), generator=gen).tolist()
        if tokens[a] + tokens[b] not in vocab:
            vocab[tokens[a] + tokens[b]] = len(vocab)
            merges.append([tokens[a], tokens[b]])
    hf = PreTrainedTokenizerFast(tokenizer_object=RawTokenizer.from_str(json.dumps(spec)),
                                 eos_token=base.hf.eos_token)
    return Tokenizer(hf=hf, key=f"{base.key}-wide{size}", eos_token_ids=base.eos_token_ids)


@functools.cache
def wide_embedded_tokenizer(size: int = WIDE) -> Tokenizer:
    """The embedded tokenizer widened to `size` ids, built once per process (seconds at 128K): the
    GPU benchmarks build a grammar host or a model per shape and batch."""
    from interlock.models.loader import embedded_tokenizer

    return wide_tokenizer(embedded_tokenizer(), size)


def scripts(backend: Any, tokenizer: Tokenizer, data: Path, per_file: int) -> list[tuple[Any, list[int]]]:
    """(compiled grammar, token ids of a valid instance) for up to per_file schemas of each file."""
    out = []
    for name in DATASET_FILES:
        found = 0
        for row in load_rows(data / name):
            if found == per_file:
                break
            if not row.valid_instances:
                continue
            ids = tokenizer.encode(json.dumps(row.valid_instances[0].data, separators=(",", ":"), ensure_ascii=False))
            try:
                compiled = backend.compile(JsonSchema(row.schema))
            except (GrammarError, ValueError):
                continue
            if len(ids) > 2 * K + 2 and backend.matcher(compiled).accept(ids):
                out.append((compiled, ids))
                found += 1
    return out


class Replay:
    """`batch` requests replaying their scripts through one path, one step per `step()` call."""

    def __init__(self, path: RowByRow | StepMasks, backend: Any, work: list[tuple[Any, list[int]]], batch: int,
                 vocab: int) -> None:
        self.path, self.vocab, self.eos = path, vocab, backend.tokenizer.eos_token_ids[0]
        self.matchers = [backend.matcher(work[b % len(work)][0]) for b in range(batch)]
        self.script = [work[b % len(work)][1] for b in range(batch)]
        self.at = [0] * batch
        self.bitmask = allocate_bitmask(batch * (K + 1), vocab)
        self.free = torch.zeros(batch * (K + 1), dtype=torch.bool)
        self.seconds: list[float] = []
        self.digests: list[str] = []

    def step(self) -> None:
        per, path, matchers, script, at = K + 1, self.path, self.matchers, self.script, self.at
        for b, m in enumerate(matchers):         # near a script's end: start it over (not timed)
            if at[b] + K + 1 >= len(script[b]):
                m.reset()
                at[b] = 0
        drafts = [tuple(script[b][at[b]: at[b] + K]) for b in range(len(matchers))]
        drafts = [d[:1] + (self.eos,) + d[2:] if b % 4 == 3 else d for b, d in enumerate(drafts)]
        start = time.perf_counter()
        requests = [Drafted(m, d, b * per) for b, (m, d) in enumerate(zip(matchers, drafts))]
        if isinstance(path, RowByRow):
            cuts = path.validate(requests, self.bitmask)
        else:
            cuts = path.check(requests, self.bitmask)
        requests = [Drafted(m, d[:n], b * per) for b, (m, d, n) in enumerate(zip(matchers, drafts, cuts))]
        rows = path.fill(requests, self.bitmask, self.free)
        tokens = [script[b][at[b]: at[b] + n + 1] for b, n in enumerate(cuts)]
        verdicts = path.accept(matchers, tokens) if isinstance(path, RowByRow) else path.commit(matchers, tokens)
        self.seconds.append(time.perf_counter() - start)
        digest = hashlib.sha256(repr((cuts, rows, verdicts)).encode())
        for b, n in enumerate(rows):
            digest.update(self.bitmask[b * per: b * per + n].numpy().tobytes())
        self.digests.append(digest.hexdigest()[:16])
        self.at[:] = [a + n + 1 for a, n in zip(at, cuts)]


def side_by_side(paths: dict[str, RowByRow | StepMasks], backend: Any, work: list[tuple[Any, list[int]]],
                 batch: int, steps: int, vocab: int) -> dict[str, dict[str, list]]:
    """Every path's step i runs before any path's step i+1, in an order rotated every step, so a
    drifting host load falls on all paths alike. Per path: per-step seconds and digests."""
    replays = {name: Replay(path, backend, work, batch, vocab) for name, path in paths.items()}
    order = list(replays.values())
    for i in range(steps + 1):                   # step 0 warms up (first fills allocate)
        for replay in order[i % len(order):] + order[: i % len(order)]:
            replay.step()
    return {name: {"seconds": r.seconds[1:], "digests": r.digests} for name, r in replays.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a smoke run: 49K ids, B = 1 and 4, 1-2 threads, 3 steps")
    p.add_argument("--steps", type=int, default=None, help="timed steps per path (default 30; --quick 3)")
    p.add_argument("--schemas", type=int, default=None, help="schemas per dataset file (default 32; --quick 2)")
    p.add_argument("--data", type=Path, default=None,
                   help="the folder of the full JSONSchemaBench sets (default: $INTERLOCK_DATA, else "
                        "../shared/data/jsonschemabench beside the checkout)")
    p.add_argument("--vocab", type=int, default=None,
                   help="only this vocabulary size, the embedded tokenizer widened to it (262144: Gemma 3's)")
    p.add_argument("--model", default=None,
                   help="only this model's own vocabulary (a .gguf file or checkpoint: Gemma 3's real 262,144 ids)")
    p.add_argument("--batches", default=None, help="batch sizes, comma-separated (default 1,8,32,64; --quick 1,4)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    data = args.data or full_sets()
    missing = [name for name in DATASET_FILES if not (data / name).is_file()]
    if missing:
        p.error(f"JSONSchemaBench files {missing} not found in {data}: set INTERLOCK_DATA to the folder "
                "holding them (the shared data, ../shared/data/jsonschemabench beside the checkout)")
    configure_logging(level="error")
    torch.set_num_threads(1)
    quick = args.quick
    steps = args.steps or (3 if quick else 30)
    batches = tuple(int(b) for b in args.batches.split(",")) if args.batches else (1, 4) if quick else (1, 8, 32, 64)
    threads = (1, 2) if quick else (1, 2, 4, 8, 16)
    base = load_tokenizer(EMBEDDED)
    vocabularies = {"49K": base} if quick else {"49K": base, "128K": wide_tokenizer(base)}
    if args.vocab:
        vocabularies = {f"{args.vocab // 1024}K": wide_tokenizer(base, args.vocab)}
    if args.model:
        tok = load_tokenizer(args.model)
        vocabularies = {f"{Path(args.model).stem} ({tok.vocab_size // 1024}K)": tok}
    load_before = load_average()
    records: list[dict[str, Any]] = []
    table = []
    for vname, tok in vocabularies.items():
        for bname in ("xgrammar", "llguidance"):
            backend = make_backend(bname, tok, tok.vocab_size)   # type: ignore[arg-type]
            work = scripts(backend, tok, data, args.schemas or (2 if quick else 32))
            for batch in batches:
                paths: dict[str, RowByRow | StepMasks] = {"per-row": RowByRow()}
                paths.update({f"batched-{t}": StepMasks(t) for t in threads})
                runs = side_by_side(paths, backend, work, batch, steps, tok.vocab_size)
                same = all(r["digests"] == runs["per-row"]["digests"] for r in runs.values())
                ms = {name: 1e3 * median(r["seconds"]) for name, r in runs.items()}
                records.append({"vocab": vname, "vocab_size": tok.vocab_size, "backend": bname, "batch": batch,
                                "schemas": len(work), "identical": same, "median_ms": ms,
                                "runs": runs})
                table.append([vname, bname, batch, len(work), "yes" if same else "NO", round(ms["per-row"], 3),
                              *[f"{ms[f'batched-{t}']:.3f} ({ms['per-row'] / ms[f'batched-{t}']:.2f}x)" for t in threads]])
            records[-1]["scripts"] = [ids for _, ids in work]
    result = {"k": K, "steps": steps, "cpu_count": __import__("os").cpu_count(), "threads": list(threads),
              "load_average_before": load_before, "load_average_after": load_average(), "records": records}
    out = Path(args.out) if args.out else RESULTS / f"mask-bench-{date.today().isoformat()}{'-quick' if quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result))
    print_table(f"a step's grammar host work, K = {K}: median ms per step over {steps} steps "
                "(per-row / batched in brackets)",
                ["vocab", "backend", "B", "schemas", "same masks", "per-row ms", *[f"{t} thr" for t in threads]], table)
    print_json_last({"saved": str(out), "identical": all(r["identical"] for r in records),
                     "median_ms": {f"{r['vocab']}/{r['backend']}/B{r['batch']}": r["median_ms"] for r in records}})


if __name__ == "__main__":
    main()
