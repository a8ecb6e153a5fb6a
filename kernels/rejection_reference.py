"""Slow obvious verification: a Python loop over rows and draft positions.

Same semantics and terms as kernels/rejection.py; the tests hold the vectorized version
against this one on the same uniforms.
"""
from __future__ import annotations

import torch

from interlock.kernels.sampling_reference import draw_one
from interlock.kernels.types import RejectionResult


def rejection_sample_reference(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    num_drafts: torch.Tensor,
    uniforms: torch.Tensor,
) -> RejectionResult:
    """p [B, K+1, V], d [B, K], q [B, K, V] | None, n [B], u [B, K+1] -> RejectionResult."""
    n_rows, k_plus_1, vocab = target_probs.shape
    k = k_plus_1 - 1
    tokens = torch.full((n_rows, k_plus_1), -1, dtype=torch.int64)
    accepted = torch.zeros(n_rows, dtype=torch.int64)
    for b in range(n_rows):
        n = max(0, min(int(num_drafts[b]), k))
        for j in range(n + 1):
            p = target_probs[b, j].float()
            if j == n:  # every valid draft accepted: bonus draw from p
                tokens[b, j] = draw_one(p, uniforms[b, k].float())
                break
            d = int(draft_tokens[b, j])
            q = _draft_dist(draft_probs, b, j, d, vocab)
            p_d = p[d] if 0 <= d < vocab else torch.tensor(0.0)
            q_d = q[d] if 0 <= d < vocab else torch.tensor(0.0)
            if uniforms[b, j].float() < p_d / q_d:
                tokens[b, j] = d
                accepted[b] += 1
                continue
            residual = (p - q).clamp(min=0)
            if float(residual.sum()) <= 0:
                residual = p
            tokens[b, j] = draw_one(residual, uniforms[b, k].float())
            break
    return RejectionResult(accepted.to(target_probs.device), tokens.to(target_probs.device))


def _draft_dist(draft_probs: torch.Tensor | None, b: int, j: int, d: int, vocab: int) -> torch.Tensor:
    if draft_probs is not None:
        return draft_probs[b, j].float()
    q = torch.zeros(vocab)
    if 0 <= d < vocab:
        q[d] = 1.0
    return q


def rejection_sample_greedy_reference(
    target_logits: torch.Tensor, draft_tokens: torch.Tensor, num_drafts: torch.Tensor
) -> RejectionResult:
    """Accept while the target's argmax equals the draft; then emit the argmax."""
    n_rows, k_plus_1, _ = target_logits.shape
    tokens = torch.full((n_rows, k_plus_1), -1, dtype=torch.int64)
    accepted = torch.zeros(n_rows, dtype=torch.int64)
    for b in range(n_rows):
        n = max(0, min(int(num_drafts[b]), k_plus_1 - 1))
        for j in range(n + 1):
            best = int(target_logits[b, j].argmax())
            if j < n and int(draft_tokens[b, j]) == best:
                tokens[b, j] = best
                accepted[b] += 1
                continue
            tokens[b, j] = best
            break
    return RejectionResult(accepted.to(target_logits.device), tokens.to(target_logits.device))
