"""Rejection-sampler time on CPU: vectorized kernels against the looping references.

Run: .venv/bin/python -m interlock.benchmarks.rejection_bench [--rows 64 --drafts 5 --vocab 49152]
Prints a table, then one JSON line with the headline numbers (milliseconds per call).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from interlock.kernels.rejection import rejection_sample, rejection_sample_greedy
from interlock.kernels.sampling import sample_from_probs


def _inputs(rows: int, k: int, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, k + 1, vocab, generator=gen) * 3
    logits[torch.rand(rows, k + 1, vocab, generator=gen) < 0.5] = float("-inf")  # a grammar mask
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits[:, :k].nan_to_num(neginf=-1e4) + torch.randn(rows, k, vocab, generator=gen), -1)
    drafts = sample_from_probs(q.reshape(-1, vocab), torch.rand(rows * k, generator=gen)).view(rows, k)
    # Greedy and point-mass (n-gram style) drafts agree with the target's argmax for a random
    # prefix, as a decent drafter would.
    agree = torch.randint(0, k + 1, (rows, 1), generator=gen)
    best = logits[:, :k].argmax(-1)
    greedy_drafts = torch.where(torch.arange(k) < agree, best, (best + 1) % vocab)
    return {"p": p, "q": q, "logits": logits, "d": drafts, "d_greedy": greedy_drafts,
            "n": torch.full((rows,), k), "u": torch.rand(rows, k + 1, generator=gen)}


def _time_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: allocator and thread pool
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--drafts", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    x = _inputs(args.rows, args.drafts, args.vocab, seed=0)
    ref_repeats = max(3, args.repeats // 5)
    cases = {
        "stochastic, draft probs": lambda b: rejection_sample(x["p"], x["d"], x["q"], x["n"], x["u"], backend=b),
        "stochastic, point mass": lambda b: rejection_sample(x["p"], x["d_greedy"], None, x["n"], x["u"], backend=b),
        "greedy": lambda b: rejection_sample_greedy(x["logits"], x["d_greedy"], x["n"], backend=b),
    }
    results = {}
    print(f"B={args.rows} K={args.drafts} V={args.vocab} threads={torch.get_num_threads()} (median ms per call)")
    print(f"{'variant':<26}{'vectorized':>12}{'reference':>12}{'speedup':>10}{'accepted/row':>14}")
    for name, call in cases.items():
        fast = _time_ms(lambda: call("torch"), args.repeats)
        ref = _time_ms(lambda: call("reference"), ref_repeats)
        results[name] = (fast, ref)
        accepted = float(call("torch").num_accepted.float().mean())
        print(f"{name:<26}{fast:>12.3f}{ref:>12.3f}{ref / fast:>9.1f}x{accepted:>14.2f}")
    fast, ref = results["stochastic, draft probs"]
    greedy_fast, greedy_ref = results["greedy"]
    print(json.dumps({
        "rows": args.rows, "drafts": args.drafts, "vocab": args.vocab,
        "vectorized_ms": round(fast, 3), "reference_ms": round(ref, 3), "speedup": round(ref / fast, 2),
        "point_mass_vectorized_ms": round(results["stochastic, point mass"][0], 3),
        "point_mass_reference_ms": round(results["stochastic, point mass"][1], 3),
        "greedy_vectorized_ms": round(greedy_fast, 3), "greedy_reference_ms": round(greedy_ref, 3),
    }))


if __name__ == "__main__":
    main()
