"""Repetition remedies on logits: repetition, frequency and presence penalties, and the per-row
token counts that make them exact under speculation.

Terms:
  R   rows;  V  vocabulary size;  B  requests;  K  draft slots
  x   logits [R, V] (after classifier-free guidance, before the grammar mask and temperature)
  c   output counts [R, V] int: how often each id occurs in the request's output so far
  m   prompt mask [R, V] bool: the id occurs in the request's prompt
  r   repetition penalty [R] (CTRL, as HF transformers and vLLM): an id that occurs in the prompt
      or the output (m | c > 0) has x / r where x > 0 and x * r where x < 0; r = 1 is off
  f   frequency penalty [R] (OpenAI): x - f * c
  a   presence penalty [R] (OpenAI): x - a * (c > 0)
Applied in that order (repetition first, as vLLM). -inf stays -inf (a banned id stays banned)
and finite parameters never make a NaN, so the grammar mask that follows sees a sane row.

Under speculation, verify position j of a request scores the token after its output plus
drafts d_1..d_j; `draft_counts` gives each position its own counts (output + drafts before it),
so penalized speculative verification samples exactly what one token at a time would.
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
from interlock.kernels.penalties_reference import apply_penalties_reference, draft_counts_reference


def apply_penalties(
    logits: torch.Tensor,
    counts: torch.Tensor,
    prompt_mask: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
    *,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Penalized logits [R, V] in logits' dtype (arithmetic in float32); see the module docstring.

    counts: c [R, V] int32/int64; prompt_mask: m [R, V] bool; presence, frequency, repetition:
    [R] float (repetition > 0).

    Raises:
        ValueError: unknown backend, wrong dtype or shape, or tensors on different devices.
    """
    check_dtype("logits", logits, FLOAT_DTYPES)
    check_shape("logits", logits, (None, None))
    n_rows, vocab = logits.shape
    check_dtype("counts", counts, INDEX_DTYPES)
    check_shape("counts", counts, (n_rows, vocab))
    check_dtype("prompt_mask", prompt_mask, (torch.bool,))
    check_shape("prompt_mask", prompt_mask, (n_rows, vocab))
    for name, t in (("presence", presence), ("frequency", frequency), ("repetition", repetition)):
        check_dtype(name, t, FLOAT_DTYPES)
        check_shape(name, t, (n_rows,))
    check_device(logits.device, counts=counts, prompt_mask=prompt_mask, presence=presence, frequency=frequency,
                 repetition=repetition)
    if resolve_backend(backend, logits.device) == "reference":
        return apply_penalties_reference(logits, counts, prompt_mask, presence, frequency, repetition)
    x = logits.float()                                                     # [R, V]
    c = counts.float()                                                     # [R, V]
    seen = prompt_mask | (counts > 0)                                      # [R, V]
    r = repetition.float().unsqueeze(1)                                    # [R, 1]
    x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    x = x - frequency.float().unsqueeze(1) * c - presence.float().unsqueeze(1) * (counts > 0).float()
    return x.to(logits.dtype)


def draft_counts(counts: torch.Tensor, drafts: torch.Tensor, num_drafts: torch.Tensor, *,
                 backend: Backend = "auto") -> torch.Tensor:
    """Counts per verify position [B, K+1, V]: position j = counts [B, V] plus the occurrences of
    drafts[:, :j] [B, K], counting only the first num_drafts [B] drafts of a row and ignoring ids
    outside [0, V) (a drafter's out-of-vocabulary id is rejected by verification anyway).

    Raises:
        ValueError: unknown backend, wrong dtype or shape, or tensors on different devices.
    """
    check_dtype("counts", counts, INDEX_DTYPES)
    check_shape("counts", counts, (None, None))
    n_rows, vocab = counts.shape
    check_dtype("drafts", drafts, INDEX_DTYPES)
    check_shape("drafts", drafts, (n_rows, None))
    check_dtype("num_drafts", num_drafts, INDEX_DTYPES)
    check_shape("num_drafts", num_drafts, (n_rows,))
    check_device(counts.device, drafts=drafts, num_drafts=num_drafts)
    if resolve_backend(backend, counts.device) == "reference":
        return draft_counts_reference(counts, drafts, num_drafts)
    k = drafts.shape[1]
    d = drafts.long()
    valid = (torch.arange(k, device=d.device).unsqueeze(0) < num_drafts.long().unsqueeze(1)) & (d >= 0) & (d < vocab)
    step = torch.zeros(n_rows, k + 1, vocab, dtype=counts.dtype, device=counts.device)    # [B, K+1, V]
    # Draft i adds one to position i + 1; a cumulative sum over positions carries it onwards.
    step[:, 1:].scatter_add_(2, torch.where(valid, d, 0).unsqueeze(2), valid.to(counts.dtype).unsqueeze(2))
    return counts.unsqueeze(1) + step.cumsum(1).to(counts.dtype)
