"""A whole step's verification as one fixed-shape function of tensors: the acceptance law, written
once. The device runner's model lane runs it after the mask event (eagerly, or inside a captured
CUDA graph); the host VerifierActor calls the same functions on its packed rows.

Terms: V model vocabulary, B verified requests (a padded bucket), K draft length, W int32 words
per bitmask row. The logits are the forward's verify rows, request b's K+1 rows at b*(K+1)+j;
its bitmask rows are the same rows of the grammar's (the request's lane is b; or `MaskInputs.rows`
names each verify row's bitmask row), valid for j < rows_filled[b] (the grammar lane's count) and
skipped where `free` says the grammar is free there, or where the request has no grammar.

The law: padded ids are never sampled, drafts past the grammar's filled rows are moot, greedy
requests take the masked argmax (lowest id on ties) and the others rejection sampling on the
masked, temperature / top-k / top-p distribution (or on the law `target` makes of it: the
grammar-conditional law, engine/conditional.py). Nothing here makes a host sync (no
.item(), no data-dependent shapes) with the default "capturable" mask backend (the Triton kernel
on CUDA, tensor ops elsewhere): every output is a tensor the caller copies to the host after the
step; the host runner asks for "torch" (xgrammar's CPU kernel, and no call when nothing is masked).
Greedy steps may come with their masked argmax already found (`verify_greedy`: the host runner's
fused native pass, which neither masks nor copies the logits); the law that follows is the same.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from interlock.kernels.bitmask import apply_token_bitmask_
from interlock.kernels.rejection import greedy_accept, rejection_sample, rejection_sample_greedy
from interlock.kernels.sampling import probs_from_logits
from interlock.protocol.sampling import SamplingParams

Mode = Literal["greedy", "sample", "filtered"]     # filtered: some request uses top-k or top-p
Target = Callable[[torch.Tensor], torch.Tensor]    # p [B, K+1, V] -> the law drafts are verified against


def sampling_mode(params: Sequence[SamplingParams]) -> Mode:
    """Which verification a step's requests need: greedy alone, sampling, or sampling with top-k/top-p."""
    if all(p.greedy for p in params):
        return "greedy"
    return "filtered" if any(p.top_k or p.top_p for p in params) else "sample"


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

    bitmask: torch.Tensor        # [B * (K+1), W] int32 (any number of rows where `rows` is given)
    rows_filled: torch.Tensor    # [B] int32
    free: torch.Tensor           # [B * (K+1)] bool
    rows: torch.Tensor | None = None       # [B * (K+1)] int64: each verify row's bitmask row; None: the same row
    unmasked: torch.Tensor | None = None   # [B] bool: lanes left unmasked (law="conditional"'s own target)


@dataclass(frozen=True)
class VerifyOutputs:
    tokens: torch.Tensor         # [B, K+1] int64: accepted drafts, the new token, then -1
    accepted: torch.Tensor       # [B] int64
    valid_drafts: torch.Tensor   # [B] int64: drafts that were verified (the rest were moot)
    peaks: torch.Tensor          # [B, K+1] float32: each row's largest allowed logit (NaN / -inf: a bad row)


def verify_step(logits: torch.Tensor, v: VerifyInputs, m: MaskInputs, tokenizer_vocab: int,
                mode: Mode, draft_probs: torch.Tensor | None = None, *, target: Target | None = None,
                mask_backend: Literal["capturable", "torch"] = "capturable") -> VerifyOutputs:
    """Mask every verify row [B (K+1), V] with its grammar row (in place when the logits are
    float32), then accept drafts (module docstring). draft_probs [B, K, V'] (V' <= V, the tokenizer's
    ids): the law each draft was drawn from (a draft model's); None: point masses (lookup drafts).
    target: what sampled rows are verified against, from their masked law (None: that law)."""
    b, k1 = v.drafts.shape[0], v.drafts.shape[1] + 1
    vocab = logits.shape[1]
    x = logits.float()                                                            # [B (K+1), V]
    mask_rows_(x, v, m, tokenizer_vocab, mask_backend)
    valid = valid_drafts(v, m)
    x = x.view(b, k1, vocab)
    peaks = x.amax(-1)                                                            # [B, K+1]
    if mode == "greedy":
        result = rejection_sample_greedy(x, v.drafts, valid)
    else:
        filtered = mode == "filtered"
        temp = v.temperature.repeat_interleave(k1)
        probs = probs_from_logits(x.view(b * k1, vocab), temp, v.top_k.repeat_interleave(k1) if filtered else None,
                                  v.top_p.repeat_interleave(k1) if filtered else None).view(b, k1, vocab)
        if target is not None:
            probs = target(probs)
        q = None if draft_probs is None else _widen(draft_probs, vocab)
        result = rejection_sample(probs, v.drafts, q, valid, v.uniforms)
    return VerifyOutputs(result.tokens, result.num_accepted, valid, peaks)


def verify_greedy(best: torch.Tensor, peaks: torch.Tensor, drafts: torch.Tensor, num_drafts: torch.Tensor,
                  constrained: torch.Tensor, rows_filled: torch.Tensor) -> VerifyOutputs:
    """Greedy verification from each verify row's masked argmax best [B, K+1] int64 (lowest id on
    ties) and its peak [B, K+1] float32 (VerifyOutputs.peaks), found by another backend than
    verify_step's masking: the host runner's fused native masked argmax or sparse head
    (actors/verifier_actor.py's lean path). The same law as verify_step's greedy mode, on the only
    inputs it reads (VerifyInputs' drafts, num_drafts and constrained, MaskInputs' rows_filled):
    the same moot drafts (`verified_drafts`), the same rule (kernels/rejection.py's greedy_accept)."""
    valid = verified_drafts(num_drafts, constrained, rows_filled)
    result = greedy_accept(best, drafts, valid)
    return VerifyOutputs(result.tokens, result.num_accepted, valid, peaks)


def mask_rows_(x: torch.Tensor, v: VerifyInputs, m: MaskInputs, tokenizer_vocab: int,
               backend: Literal["capturable", "torch"] = "capturable") -> None:
    """The verify rows x [B (K+1), V] float32, in place: padded ids -inf, then each row's grammar
    row where it has one (not past the filled rows, not free, not an unmasked lane)."""
    x[:, tokenizer_vocab:] = float("-inf")                                        # padded ids: never
    skip = grammar_skip(v, m)
    if m.unmasked is not None:
        skip = skip | m.unmasked.repeat_interleave(v.drafts.shape[1] + 1)
    if backend == "torch" and bool(skip.all()):     # a host read: nothing to mask, no call
        return
    apply_token_bitmask_(x, m.bitmask, rows=m.rows, skip=skip, mask_vocab_size=tokenizer_vocab, backend=backend)


def grammar_skip(v: VerifyInputs, m: MaskInputs) -> torch.Tensor:
    """[B (K+1)] bool: the verify rows no grammar row applies to (no grammar, past the rows the
    grammar filled, or a free row: it would allow every id)."""
    b, k1 = v.drafts.shape[0], v.drafts.shape[1] + 1
    j = torch.arange(k1, device=v.drafts.device)
    filled = m.rows_filled.long()                                                 # [B]
    return (~v.constrained.unsqueeze(1) | (j >= filled.unsqueeze(1)) | m.free.view(b, k1)).reshape(-1)


def _widen(q: torch.Tensor, vocab: int) -> torch.Tensor:
    """q [B, K, V'] over the first V' ids -> [B, K, V] (the model's padded ids have q = 0)."""
    if q.shape[-1] == vocab:
        return q
    return torch.cat([q, q.new_zeros(*q.shape[:-1], vocab - q.shape[-1])], dim=-1)


def valid_drafts(v: VerifyInputs, m: MaskInputs) -> torch.Tensor:
    """[B] int64: the drafts that are verified (`verified_drafts`)."""
    return verified_drafts(v.num_drafts, v.constrained, m.rows_filled)


def verified_drafts(num_drafts: torch.Tensor, constrained: torch.Tensor, rows_filled: torch.Tensor) -> torch.Tensor:
    """[B] int64 of num_drafts [B] int64: a constrained request's drafts past the grammar's filled
    rows rows_filled [B] (after a refused draft) are moot."""
    return torch.where(constrained, torch.minimum(num_drafts, (rows_filled - 1).clamp(min=0)), num_drafts)


def allowed_ids(v: VerifyInputs, m: MaskInputs, lanes: torch.Tensor, tokenizer_vocab: int,
                vocab: int) -> torch.Tensor:
    """[L, K+1, V] bool: the ids each verify row of `lanes` [L] may emit under its grammar row
    (every tokenizer id where no grammar row applies): what law="conditional" needs of its unmasked rows."""
    k1 = v.drafts.shape[1] + 1
    pick = (lanes.unsqueeze(1) * k1 + torch.arange(k1, device=lanes.device)).view(-1)    # [L (K+1)]
    rows = m.rows if m.rows is not None else torch.arange(v.drafts.shape[0] * k1, device=lanes.device)
    x = torch.zeros(pick.shape[0], vocab, device=lanes.device)
    x[:, tokenizer_vocab:] = float("-inf")
    apply_token_bitmask_(x, m.bitmask, rows=rows[pick], skip=grammar_skip(v, m)[pick], mask_vocab_size=tokenizer_vocab)
    return (x == 0).view(-1, k1, vocab)
