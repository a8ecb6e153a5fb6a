"""A whole step's verification as one fixed-shape function of tensors: what the device runner's
model lane runs after the mask event (eagerly, or inside a captured CUDA graph).

Terms: V model vocabulary, B verified requests (a padded bucket), K draft length, W int32 words
per bitmask row. The logits are the forward's verify rows, request b's K+1 rows at b*(K+1)+j;
its bitmask rows are the same rows of the grammar's (the request's lane is b), valid for
j < rows_filled[b] (the grammar lane's count) and skipped where `free` says the grammar is free
there, or where the request has no grammar.

It decides exactly what the host VerifierActor decides for the same rows: padded ids are never
sampled, drafts past the grammar's filled rows are moot, greedy requests take the masked argmax
(lowest id on ties) and the others rejection sampling on the masked, temperature / top-k / top-p
distribution. It makes no host sync (no .item(), no data-dependent shapes): every output is a
tensor the caller copies to the host after the step. The bitmask is applied with the
"capturable" backend: the Triton kernel on CUDA, tensor ops elsewhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from interlock.kernels.bitmask import apply_token_bitmask_
from interlock.kernels.rejection import rejection_sample, rejection_sample_greedy
from interlock.kernels.sampling import probs_from_logits

Mode = Literal["greedy", "sample", "filtered"]     # filtered: some request uses top-k or top-p


@dataclass(frozen=True)
class VerifyInputs:
    """One step's verification inputs, all on the logits' device (fixed shapes for a bucket)."""

    drafts: torch.Tensor         # [B, K] int64
    num_drafts: torch.Tensor     # [B] int64: drafts the request brought (after the grammar's cut)
    constrained: torch.Tensor    # [B] bool
    temperature: torch.Tensor    # [B] float32, 0 for greedy
    top_k: torch.Tensor          # [B] int64, 0: off
    top_p: torch.Tensor          # [B] float32, 1: off
    uniforms: torch.Tensor       # [B, K+1] float32


@dataclass(frozen=True)
class MaskInputs:
    """The grammar lane's step output for the step's lanes, on the logits' device."""

    bitmask: torch.Tensor        # [B * (K+1), W] int32
    rows_filled: torch.Tensor    # [B] int32
    free: torch.Tensor           # [B * (K+1)] bool


@dataclass(frozen=True)
class VerifyOutputs:
    tokens: torch.Tensor         # [B, K+1] int64: accepted drafts, the new token, then -1
    accepted: torch.Tensor       # [B] int64
    valid_drafts: torch.Tensor   # [B] int64: drafts that were verified (the rest were moot)
    peaks: torch.Tensor          # [B, K+1] float32: each row's largest allowed logit (NaN / -inf: a bad row)


def verify_step(logits: torch.Tensor, v: VerifyInputs, m: MaskInputs, tokenizer_vocab: int,
                mode: Mode, draft_probs: torch.Tensor | None = None) -> VerifyOutputs:
    """Mask every verify row [B (K+1), V] with its grammar row (in place when the logits are
    float32), then accept drafts (module docstring). draft_probs [B, K, V'] (V' <= V, the tokenizer's
    ids): the law each draft was drawn from (a draft model's); None: point masses (lookup drafts)."""
    b, k1 = v.drafts.shape[0], v.drafts.shape[1] + 1
    vocab = logits.shape[1]
    x = logits.float()                                                            # [B (K+1), V]
    x[:, tokenizer_vocab:] = float("-inf")                                        # padded ids: never
    j = torch.arange(k1, device=x.device)
    filled = m.rows_filled.long()                                                 # [B]
    skip = ~v.constrained.unsqueeze(1) | (j >= filled.unsqueeze(1)) | m.free.view(b, k1)
    apply_token_bitmask_(x, m.bitmask, skip=skip.reshape(-1), mask_vocab_size=tokenizer_vocab,
                         backend="capturable")
    valid = valid_drafts(v, m)
    x = x.view(b, k1, vocab)
    peaks = x.amax(-1)                                                            # [B, K+1]
    if mode == "greedy":
        result = rejection_sample_greedy(x, v.drafts, valid)
    else:
        filtered = mode == "filtered"
        temp = v.temperature.repeat_interleave(k1)
        probs = probs_from_logits(x.view(b * k1, vocab), temp, v.top_k.repeat_interleave(k1) if filtered else None,
                                  v.top_p.repeat_interleave(k1) if filtered else None)
        q = None if draft_probs is None else _widen(draft_probs, vocab)
        result = rejection_sample(probs.view(b, k1, vocab), v.drafts, q, valid, v.uniforms)
    return VerifyOutputs(result.tokens, result.num_accepted, valid, peaks)


def _widen(q: torch.Tensor, vocab: int) -> torch.Tensor:
    """q [B, K, V'] over the first V' ids -> [B, K, V] (the model's padded ids have q = 0)."""
    if q.shape[-1] == vocab:
        return q
    return torch.cat([q, q.new_zeros(*q.shape[:-1], vocab - q.shape[-1])], dim=-1)


def valid_drafts(v: VerifyInputs, m: MaskInputs) -> torch.Tensor:
    """[B] int64: the drafts that are verified: a constrained request's past the grammar's filled
    rows (after a refused draft) are moot."""
    filled = m.rows_filled.long()
    return torch.where(v.constrained, torch.minimum(v.num_drafts, (filled - 1).clamp(min=0)), v.num_drafts)
