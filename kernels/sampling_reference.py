"""Slow obvious versions of kernels/sampling.py: one row at a time, Python floats and lists.

Same semantics as the fast path (see sampling.py for the terms); the tests hold the two
against each other.
"""
from __future__ import annotations

import math

import torch


def probs_from_logits_reference(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """[R, V] logits -> [R, V] float32 probabilities, looping over rows (None: off)."""
    out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
    for r, row in enumerate(logits.float().tolist()):
        k = int(top_k[r]) if top_k is not None else 0
        p = float(top_p[r]) if top_p is not None else 1.0
        out[r] = torch.tensor(_row_probs(row, float(temperature[r]), k, p), dtype=torch.float32)
    return out


def _row_probs(row: list[float], temperature: float, top_k: int, top_p: float) -> list[float]:
    vocab = len(row)
    if temperature <= 0:
        best = max(range(vocab), key=lambda t: (row[t], -t))  # lowest id wins a tie
        return [1.0 if t == best else 0.0 for t in range(vocab)]
    x = [v / temperature for v in row]
    order = sorted(range(vocab), key=lambda t: -x[t])  # stable: ties keep lower id first
    kept = [t for t in order if x[t] > -math.inf]
    if 0 < top_k < vocab and kept:
        kth = x[order[top_k - 1]]
        kept = [t for t in kept if x[t] >= kth]
    cut: list[int]
    if top_p < 1 and kept:
        weights = _softmax([x[t] for t in kept])
        mass, cut = 0.0, []
        for t, w in zip(kept, weights):
            if cut and mass >= top_p:
                break
            cut.append(t)
            mass += w
        kept = cut
    probs = [0.0] * vocab
    for t, w in zip(kept, _softmax([x[t] for t in kept])):
        probs[t] = w
    return probs


def _softmax(values: list[float]) -> list[float]:
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


def sample_from_probs_reference(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """[R, V] weights, [R] uniforms -> int64 [R], one row at a time."""
    return torch.tensor(
        [draw_one(probs[r].float(), uniforms[r].float()) for r in range(probs.shape[0])],
        dtype=torch.int64,
        device=probs.device,
    )


def draw_one(weights: torch.Tensor, u: torch.Tensor) -> int:
    """Walk the float32 cumulative sum of weights [V] to the first value above u * total."""
    cdf = weights.cumsum(0)  # the same float32 sums the fast path makes, so draws agree bit for bit
    total = cdf[-1]
    target = float(torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total))))
    for t, c in enumerate(cdf.tolist()):
        if c > target:
            return t
    return len(weights) - 1
