"""`python -m interlock.benchmarks.detok_cost`: what turning a step's tokens into text costs, by output length.

Side by side in one process, on the same ids pushed a few at a time as speculative steps deliver
them: `IncrementalText` (models/detokenize.py: tokenizers' DecodeStream per push, one full decode at
the end) against decoding every id so far at every push (what IncrementalText did before, and the
plain way to never split a character). The ids are the embedded tokenizer's encoding of JME
instances joined until long enough: JSON text, as the engine emits it. Prints microseconds per push
and the ratio; saves the JSON (ids included) under benchmarks/results/.
"""
from __future__ import annotations

import argparse
import json
import time
from datetime import date
from pathlib import Path

from interlock.benchmarks.common import median, print_json_last, print_table
from interlock.benchmarks.prompts import DATASETS, load_rows
from interlock.models.detokenize import IncrementalText
from interlock.models.loader import EMBEDDED, load_tokenizer
from interlock.models.tokenizer import Tokenizer

RESULTS = Path(__file__).resolve().parent / "results"


def json_ids(tokenizer: Tokenizer, n: int) -> list[int]:
    """n ids of JSON text: JME's instances, one after another."""
    ids: list[int] = []
    for row in load_rows(DATASETS / "JME.jsonl"):
        for instance in row.valid_instances:
            ids += tokenizer.encode(json.dumps(instance.data))
            if len(ids) >= n:
                return ids[:n]
    raise ValueError(f"JME has fewer than {n} tokens of valid instances")


def per_push_us(push_all: object, ids: list[int], step: int, repeats: int) -> float:
    """Median over repeats of the mean time per push, feeding `ids` `step` at a time."""
    times = []
    for _ in range(repeats):
        push = push_all()            # a fresh decoder
        start = time.perf_counter()
        for i in range(0, len(ids), step):
            push(ids[i: i + step], i + step >= len(ids))
        times.append((time.perf_counter() - start) / -(-len(ids) // step))
    return median(times) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[128, 1000, 3000])
    p.add_argument("--step", type=int, default=3, help="tokens per push (a speculative step's)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    tokenizer = load_tokenizer(EMBEDDED)

    def streamed():
        text = IncrementalText(tokenizer)
        return lambda ids, final: text.push(ids, final)

    def whole():
        seen: list[int] = []

        def push(ids: list[int], final: bool) -> str:
            seen.extend(ids)
            return tokenizer.decode(seen, skip_special_tokens=True)
        return push

    rows, raw = [], []
    for n in args.lengths:
        ids = json_ids(tokenizer, n)
        now, before = per_push_us(streamed, ids, args.step, args.repeats), per_push_us(whole, ids, args.step, args.repeats)
        rows.append({"output_tokens": n, "streamed_us_per_push": round(now, 1),
                     "whole_decode_us_per_push": round(before, 1), "whole_over_streamed": round(before / now, 2)})
        raw.append({"output_tokens": n, "token_ids": ids})
    result = {"step": args.step, "repeats": args.repeats, "rows": rows}
    out = Path(args.out) if args.out else RESULTS / f"detok-cost-{date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result, "ids": raw}))
    keys = list(rows[0])
    print_table(f"text per push ({args.step} tokens a push), median of {args.repeats}", keys,
                [[r[k] for k in keys] for r in rows])
    print_json_last({**result, "saved": str(out)})


if __name__ == "__main__":
    main()
