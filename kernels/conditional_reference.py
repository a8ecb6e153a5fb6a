"""Slow obvious versions of kernels/conditional.py, one row and one id at a time."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from interlock.protocol.types import TokenId


def conditional_target_reference(p: torch.Tensor, allowed: torch.Tensor, known: torch.Tensor,
                                 live: Sequence[Mapping[TokenId, float]]) -> torch.Tensor:
    """Each row: an unknown node's p as is; a known node's p(c) a(c) L(c) (L = 1 unexplored), normalised."""
    out = torch.zeros(p.shape, dtype=torch.float32)
    for r in range(p.shape[0]):
        weights = [1.0] * p.shape[1]
        if bool(known[r]):
            weights = [float(allowed[r, c]) * live[r].get(c, 1.0) for c in range(p.shape[1])]
        row = [float(p[r, c]) * weights[c] for c in range(p.shape[1])]
        total = sum(row)
        out[r] = torch.tensor([x / total if total > 0 else 0.0 for x in row])
    return out
