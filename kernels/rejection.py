"""Speculative-decoding verification (rejection sampling), vectorized over rows and drafts.

Terms:
  B   rows (requests in the step);  K  draft slots per row;  V  vocabulary size
  p   target probabilities [B, K+1, V]: row b, position j is the target's distribution for
      the token after the first j drafts. Already masked by the grammar and processed by
      temperature/top-k/top-p (kernels.sampling.probs_from_logits), so masked ids have p = 0.
  d   draft tokens [B, K] int64 (padding past n may hold anything, e.g. -1)
  q   draft probabilities [B, K, V], or None: each draft is a point mass (n-gram, forced
      and user drafts)
  n   valid drafts per row [B], 0 <= n <= K
  u   uniforms [B, K+1] in [0, 1): u[:, j] decides draft j, u[:, K] drives the one
      resample / bonus draw (at most one happens per row)

Stochastic rule: accept draft j iff u_j < p_j(d_j) / q_j(d_j), i.e. with probability
min(1, p/q). At the first rejection emit a draw from normalize(max(0, p_j - q_j)); if all
n drafts are accepted emit a bonus draw from p_n. The emitted sequence is distributed
exactly as sampling the target one token at a time, and an id with p = 0 is never emitted.
A greedy row (p one-hot, temperature 0) gets exactly the greedy result from this rule, so
one call serves a batch that mixes greedy and sampled requests.

Output: num_accepted [B] int64 and tokens [B, K+1] int64 = the accepted drafts, then the
one new token, then -1 padding. Row b emits num_accepted[b] + 1 tokens.
"""
from __future__ import annotations

import torch

from interlock.kernels._checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    Backend,
    check_device,
    check_dtype,
    check_shape,
    resolve_backend,
)
from interlock.kernels.rejection_reference import rejection_sample_greedy_reference, rejection_sample_reference
from interlock.kernels.sampling import inverse_cdf
from interlock.kernels.types import RejectionResult


def rejection_sample(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    num_drafts: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    backend: Backend = "auto",
) -> RejectionResult:
    """Verify drafts against the target by rejection sampling (see the module docstring).

    Args:
        target_probs: p [B, K+1, V] float, masked and temperature/top-k/top-p processed.
        draft_tokens: d [B, K] int32/int64.
        draft_probs: q [B, K, V] float, or None for point-mass drafts.
        num_drafts: n [B] int32/int64, 0 <= n <= K (not checked: that needs a host sync).
        uniforms: u [B, K+1] float in [0, 1), drawn per request by the caller.
        backend: "auto" (Triton for CUDA tensors, else "torch") | "torch" | "reference" |
            "cuda" (kernels/rejection_triton.py: equal to "torch" on the same uniforms, up to
            the rounding of the cumulative sum at a CDF step; CUDA tensors only).

    Raises:
        ValueError: unknown backend, wrong dtype or shape, or tensors on different devices.
    """
    _, k_plus_1, _ = _check(target_probs, draft_tokens, draft_probs, num_drafts, uniforms)
    resolved = resolve_backend(backend, target_probs.device, has_cuda=True)
    if resolved == "reference":
        return rejection_sample_reference(target_probs, draft_tokens, draft_probs, num_drafts, uniforms)
    if resolved == "cuda" and k_plus_1 > 1:  # K = 0 is plain sampling: the torch path serves it
        from interlock.kernels.rejection_triton import rejection_sample_triton  # needs triton + CUDA

        return rejection_sample_triton(target_probs, draft_tokens, draft_probs, num_drafts, uniforms)
    return _rejection_torch(target_probs, draft_tokens, draft_probs, num_drafts, uniforms)


def rejection_sample_greedy(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_drafts: torch.Tensor,
    *,
    backend: Backend = "auto",
) -> RejectionResult:
    """Greedy verification: accept while argmax(target_j) == d_j, then emit the argmax.

    target_logits [B, K+1, V] are masked logits (or probabilities: only the argmax counts,
    lowest id on ties). The emitted token is the argmax at the first mismatch, or the
    bonus argmax at position n when all n drafts match.

    Raises:
        ValueError: unknown backend, wrong dtype or shape, or tensors on different devices.
    """
    n_rows, k_plus_1, _ = _check(target_logits, draft_tokens, None, num_drafts, None)
    resolved = resolve_backend(backend, target_logits.device, has_cuda=True)
    if resolved == "reference":
        return rejection_sample_greedy_reference(target_logits, draft_tokens, num_drafts)
    if resolved == "cuda":
        from interlock.kernels.rejection_triton import rejection_sample_greedy_triton  # needs triton + CUDA

        return rejection_sample_greedy_triton(target_logits, draft_tokens, num_drafts)
    return greedy_accept(target_logits.argmax(-1), draft_tokens, num_drafts)


def greedy_accept(best: torch.Tensor, draft_tokens: torch.Tensor, num_drafts: torch.Tensor) -> RejectionResult:
    """The greedy rule on each position's target argmax best [B, K+1] int64, however a backend found
    it (torch's argmax above, a fused masked argmax or sparse head on the host: kernels/verify.py's
    `verify_greedy`): accept d_j while best_j == d_j (j < n), then emit best at the first mismatch,
    or the bonus best_n. An accepted draft equals best where it stands, so the emitted tokens are
    best up to num_accepted, then -1. Few tensor calls (the host's lean path runs this on every
    step, where each costs microseconds): dtypes are left to promotion."""
    k = best.shape[1] - 1
    pos = torch.arange(k + 1, device=best.device)  # [K+1]
    ok = (best[:, :k] == draft_tokens) & (pos[:k] < num_drafts.unsqueeze(1))  # [B, K]
    n_acc = ok.cumprod(1).sum(1)  # [B] int64: the leading True entries
    return RejectionResult(n_acc, torch.where(pos <= n_acc.unsqueeze(1), best, -1))


def _rejection_torch(p: torch.Tensor, d: torch.Tensor, q: torch.Tensor | None, n: torch.Tensor,
                     u: torch.Tensor) -> RejectionResult:
    n_rows, k_plus_1, vocab = p.shape
    k = k_plus_1 - 1
    p, u, d = p.float(), u.float(), d.long()
    rows = torch.arange(n_rows, device=p.device)  # [B]
    slots = torch.arange(k, device=p.device)  # [K]
    in_vocab = (d >= 0) & (d < vocab)  # [B, K]; a draft outside the vocabulary is rejected
    d_safe = torch.where(in_vocab, d, 0)  # [B, K]
    p_d = p[rows.unsqueeze(1), slots, d_safe] * in_vocab  # [B, K]
    q_d = torch.ones_like(p_d) if q is None else q[rows.unsqueeze(1), slots, d_safe].float()  # [B, K]
    # u < p/q: q = 0 gives inf (accept when p > 0) or nan (p = 0: rejected).
    accept = (u[:, :k] < p_d / q_d) & _valid(n, k)  # [B, K]
    n_acc = _leading_true(accept)  # [B]
    rejected = n_acc < n.long().clamp(max=k)  # [B]; False: all valid drafts taken, bonus draw

    weights = p[rows, n_acc]  # [B, V], a fresh copy: the law at the new token's position
    if k > 0:  # static: with no draft slots every row takes the bonus draw
        weights = _residual_(weights, d_safe, in_vocab, q, rows, n_acc.clamp(max=k - 1), rejected)
    new = inverse_cdf(weights, u[:, k])  # [B]
    return RejectionResult(n_acc, _assemble(d, n_acc, new))


def _residual_(p_at: torch.Tensor, d_safe: torch.Tensor, in_vocab: torch.Tensor, q: torch.Tensor | None,
               rows: torch.Tensor, slot: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """[B, V]: max(0, p - q) on rejected rows, p itself on bonus rows; may reuse p_at."""
    if q is None:
        # A point mass at d: max(0, p - q) is p with d's entry zeroed (one write per row).
        # No empty-residual fallback is needed: a rejected d had p(d) <= u < 1.
        d_at = d_safe[rows, slot]  # [B]
        drop = rejected & in_vocab[rows, slot]  # [B]
        return p_at.index_put_((rows, d_at), p_at[rows, d_at] * ~drop)
    q_at = q[rows, slot].float()  # [B, V]
    # One fused pass: p - q on rejected rows, p - 0 = p on bonus rows.
    residual = torch.addcmul(p_at, q_at, rejected.unsqueeze(1).to(q_at.dtype), value=-1.0).clamp_(min=0)
    # p == q up to rounding can leave no residual mass; then p itself is the right law.
    return torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_at)


def _valid(num_drafts: torch.Tensor, k: int) -> torch.Tensor:
    """[B, K] bool: draft slot j holds a real draft."""
    return torch.arange(k, device=num_drafts.device).unsqueeze(0) < num_drafts.long().unsqueeze(1)


def _leading_true(mask: torch.Tensor) -> torch.Tensor:
    """[B, K] bool -> [B] int64: how many leading entries are True."""
    return mask.long().cumprod(dim=1).sum(dim=1)


def _assemble(d: torch.Tensor, n_acc: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """[B, K+1] int64: drafts before n_acc, the new token at n_acc, -1 after."""
    n_rows, k = d.shape
    pos = torch.arange(k + 1, device=d.device).unsqueeze(0)  # [1, K+1]
    padded = torch.cat([d, torch.full((n_rows, 1), -1, dtype=torch.long, device=d.device)], dim=1)
    out = torch.where(pos < n_acc.unsqueeze(1), padded, -1)
    return torch.where(pos == n_acc.unsqueeze(1), new.unsqueeze(1), out)


def _check(p: torch.Tensor, d: torch.Tensor, q: torch.Tensor | None, n: torch.Tensor,
           u: torch.Tensor | None) -> tuple[int, int, int]:
    check_dtype("target", p, FLOAT_DTYPES)
    check_shape("target", p, (None, None, None))
    n_rows, k_plus_1, vocab = p.shape
    if k_plus_1 < 1:
        raise ValueError("target must have at least one position (K+1 >= 1)")
    check_dtype("draft_tokens", d, INDEX_DTYPES)
    check_shape("draft_tokens", d, (n_rows, k_plus_1 - 1))
    check_dtype("num_drafts", n, INDEX_DTYPES)
    check_shape("num_drafts", n, (n_rows,))
    if q is not None:
        check_dtype("draft_probs", q, FLOAT_DTYPES)
        check_shape("draft_probs", q, (n_rows, k_plus_1 - 1, vocab))
    if u is not None:
        check_dtype("uniforms", u, FLOAT_DTYPES)
        check_shape("uniforms", u, (n_rows, k_plus_1))
    check_device(p.device, draft_tokens=d, draft_probs=q, num_drafts=n, uniforms=u)
    return n_rows, k_plus_1, vocab
