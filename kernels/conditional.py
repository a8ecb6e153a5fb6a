"""The grammar-conditional law's target at one verify row: the model's law with the mass earlier
attempts proved dead removed (protocol/conditional.py has the terms and the exactness argument).

Terms: R rows, V vocabulary.
  p        [R, V] the model's probabilities at the row: temperature / top-k / top-p on the UNMASKED
           logits (kernels.sampling.probs_from_logits), padded ids 0
  allowed  [R, V] bool: the ids the grammar allows at the row (its stop rule applied by the caller)
  known    [R] bool: some earlier attempt drew from the row's node, so its mask is knowledge
  live     per row, {token: L(child)} over the node's explored children (empty for an unknown node)
  w        [R, V] weights: at a known node a(c) * L(c) (L = 1 for an unexplored child); 1 elsewhere

The target is normalise(p * w). At a known node its normaliser is L(node); at an unknown one w = 1
and the target is p itself, refused ids included: drawing one ends the attempt, which is the
rejection the law needs (masking there would be the masked law's bias again). Verification
(kernels/rejection.py) accepts drafts against this target exactly as against any other.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from interlock.protocol.types import TokenId


def live_weights(allowed: torch.Tensor, known: torch.Tensor,
                 live: Sequence[Mapping[TokenId, float]]) -> torch.Tensor:
    """w [R, V] float32 (module docstring) from allowed [R, V] bool, known [R] bool and each row's live map."""
    w = torch.where(known.unsqueeze(1), allowed.float(), torch.ones_like(allowed, dtype=torch.float32))  # [R, V]
    rows = [r for r, m in enumerate(live) for _ in m]
    if rows:
        ids = torch.tensor([t for m in live for t in m], dtype=torch.long)
        values = torch.tensor([v for m in live for v in m.values()], dtype=torch.float32)
        r = torch.tensor(rows, dtype=torch.long)
        w[r, ids] = w[r, ids] * values          # a refused child stays 0; an explored one gets its L
    return w


def conditional_target(p: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """normalise(p * w) [R, V]; a row with no mass left stays 0 (no attempt reaches a dead node)."""
    x = p.float() * w                                                     # [R, V]
    return x / x.sum(-1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)


def allowed_mass(p: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """[R]: the model's mass on the ids the grammar allows at each row (what a Visit records)."""
    return (p.double() * allowed).sum(-1)
