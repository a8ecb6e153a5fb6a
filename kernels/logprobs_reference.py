"""Slow obvious version of kernels/logprobs.py: one row at a time, log of the reference law.

The law is sampling_reference's (the same one the sampler draws from), at T = 1 for greedy rows.
"""
from __future__ import annotations

import math

import torch

from interlock.kernels.sampling_reference import _row_probs
from interlock.kernels.types import Logprobs


def token_logprobs_reference(logits: torch.Tensor, tokens: torch.Tensor, temperature: torch.Tensor,
                             top_k: torch.Tensor | None, top_p: torch.Tensor | None, n: int) -> Logprobs:
    rows = logits.shape[0]
    token = torch.empty(rows)
    top_ids = torch.zeros(rows, n, dtype=torch.long)
    top = torch.full((rows, n), float("-inf"))
    for r, row in enumerate(logits.float().tolist()):
        t = float(temperature[r])
        probs = _row_probs(row, t if t > 0 else 1.0, int(top_k[r]) if top_k is not None else 0,
                           float(top_p[r]) if top_p is not None else 1.0)
        logp = [math.log(p) if p > 0 else -math.inf for p in probs]
        token[r] = logp[int(tokens[r])]
        best = sorted(range(len(logp)), key=lambda i: (-logp[i], i))[:n]
        top_ids[r, : len(best)] = torch.tensor(best, dtype=torch.long)
        top[r, : len(best)] = torch.tensor([logp[i] for i in best])
    return Logprobs(token, top_ids, top)
