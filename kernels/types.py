"""Results that kernels hand back to their callers."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RejectionResult:
    """What one verification step emits.

    num_accepted: [B] int64, accepted drafts per row.
    tokens: [B, K+1] int64, the accepted drafts, then the one new token, then -1 padding;
        row b emits num_accepted[b] + 1 tokens.
    """

    num_accepted: torch.Tensor
    tokens: torch.Tensor


@dataclass(frozen=True)
class Logprobs:
    """Log-probabilities of emitted tokens (kernels/logprobs.py).

    token: [R] float32, each row's token. top_ids: [R, N] int64 and top: [R, N] float32, the row's
        N most likely ids, most likely first; top is -inf where a row allows fewer than N ids.
    """

    token: torch.Tensor
    top_ids: torch.Tensor
    top: torch.Tensor
