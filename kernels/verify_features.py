"""The optional parts of a step's verification on the device runner, as fixed-shape functions of
tensors: classifier-free guidance, repetition penalties and log-probabilities. What
`verify_features` adds around kernels/verify.py's `verify_step`, inside the same captured step.

Terms as in verify.py (B verified requests, a padded bucket; K draft length, K1 = K+1 verify rows
per request; V model vocabulary), plus:
  G   companion row sets (CFG): the forward's logits hold the B requests' K1 rows each, then G
      companions' K1 rows each (companion g at rows (B+g)*K1 + j)
  P   penalty rows: per-request counts kept on the device between steps (row P is all zero: the
      row an unpenalized lane reads)
  N   log-probability alternatives per row

Order, as the host VerifierActor applies them: guide (cond and uncond rows combined), penalize
(each verify position counts the output so far plus the drafts before it), then verify_step's
padded-id and grammar masks and verification, then the log-probabilities of the emitted tokens
under the masked rows they were verified against. A lane without a feature keeps its rows bit for
bit (scale 1, no penalty), so a request pays nothing for its neighbour's features but the step's
time. Every function here makes no host sync: it may sit in a captured CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from interlock.kernels.cfg import cfg_combine
from interlock.kernels.logprobs import token_logprobs
from interlock.kernels.penalties import apply_penalties, draft_counts
from interlock.kernels.types import Logprobs
from interlock.kernels.verify import MaskInputs, Mode, VerifyInputs, VerifyOutputs, valid_drafts, verify_step


@dataclass(frozen=True)
class GuideInputs:
    """Which companion guides each lane, and how strongly."""

    companion: torch.Tensor      # [B] int64: lane b's companion g (any g < G where unguided)
    scale: torch.Tensor          # [B] float32: guided = u + s (c - u); 1 where unguided (c, bit for bit)


@dataclass(frozen=True)
class PenaltyInputs:
    """Each lane's penalty row and parameters (neutral where unpenalized)."""

    row: torch.Tensor            # [B] int64: the lane's row of the counts (P where unpenalized)
    penalized: torch.Tensor      # [B] bool
    presence: torch.Tensor       # [B] float32
    frequency: torch.Tensor      # [B] float32
    repetition: torch.Tensor     # [B] float32


@dataclass(frozen=True)
class PenaltyCounts:
    """Per-request token counts, on the device between steps (module docstring)."""

    counts: torch.Tensor         # [P+1, V] int32: occurrences in the request's output so far
    prompt: torch.Tensor         # [P+1, V] bool: the id occurs in the request's prompt

    @classmethod
    def allocate(cls, rows: int, vocab: int, device: torch.device) -> PenaltyCounts:
        return cls(torch.zeros(rows + 1, vocab, dtype=torch.int32, device=device),
                   torch.zeros(rows + 1, vocab, dtype=torch.bool, device=device))


@dataclass(frozen=True)
class Features:
    """A step's features: None where the step has none of that kind (it then costs nothing)."""

    guide: GuideInputs | None = None
    penalties: tuple[PenaltyInputs, PenaltyCounts] | None = None
    logprobs: int | None = None  # N alternatives computed per row (the token's own always)


def guide_lanes(logits: torch.Tensor, g: GuideInputs, k1: int) -> torch.Tensor:
    """Guided rows [B K1, V] from the forward's [(B+G) K1, V] (module docstring)."""
    b = g.scale.shape[0]
    vocab = logits.shape[1]
    cond = logits[: b * k1]                                                       # [B K1, V]
    uncond = logits[b * k1:].view(-1, k1, vocab).index_select(0, g.companion)     # [B, K1, V]
    scale = g.scale.repeat_interleave(k1)                                         # [B K1]
    guided = cfg_combine(cond, uncond.view(b * k1, vocab), scale)
    # u + 1 (c - u) is c only up to rounding: scale 1 (and every unguided lane) keeps c exactly
    return torch.where((scale == 1.0).unsqueeze(1), cond, guided)


def penalize_lanes(x: torch.Tensor, p: PenaltyInputs, c: PenaltyCounts, drafts: torch.Tensor,
                   valid: torch.Tensor) -> torch.Tensor:
    """Penalized rows [B K1, V]: verify position j of lane b counts its output plus drafts[b, :j]
    (only its `valid` [B] drafts: past them the rows are moot)."""
    b, k = drafts.shape
    k1, vocab = k + 1, x.shape[1]
    counts = draft_counts(c.counts.index_select(0, p.row), drafts, valid)         # [B, K1, V]
    prompt = c.prompt.index_select(0, p.row).unsqueeze(1).expand(b, k1, vocab)   # [B, K1, V]

    def per_row(t: torch.Tensor) -> torch.Tensor:
        return t.repeat_interleave(k1)                                            # [B K1]

    y = apply_penalties(x, counts.reshape(b * k1, vocab), prompt.reshape(b * k1, vocab), per_row(p.presence),
                        per_row(p.frequency), per_row(p.repetition))
    return torch.where(per_row(p.penalized).unsqueeze(1), y, x)


def count_tokens_(c: PenaltyCounts, p: PenaltyInputs, tokens: torch.Tensor) -> None:
    """Add each penalized lane's emitted tokens [B, K1] (-1: none) to its row of the counts, in
    place. Integer atomics: the same counts in any order."""
    vocab = c.counts.shape[1]
    emitted = (tokens >= 0) & (tokens < vocab) & p.penalized.unsqueeze(1)            # [B, K1]
    index = p.row.unsqueeze(1) * vocab + tokens.clamp(0, vocab - 1)                   # [B, K1]
    c.counts.view(-1).scatter_add_(0, index.view(-1), emitted.to(c.counts.dtype).view(-1))


def lane_logprobs(x: torch.Tensor, tokens: torch.Tensor, v: VerifyInputs, mode: Mode, n: int) -> Logprobs:
    """Log-probabilities of each lane's tokens [B, K1] under the masked rows x [B K1, V] they were
    verified against (temperature, and top-k / top-p in "filtered" mode, as verification used
    them; a greedy row at T = 1), and each row's n best: token [B, K1], top_ids and top [B, K1, n].
    Rows past a lane's emitted tokens hold values nobody reads."""
    b, k1 = tokens.shape

    def per_row(t: torch.Tensor) -> torch.Tensor:
        return t.repeat_interleave(k1)

    filtered = mode == "filtered"
    out = token_logprobs(x, tokens.clamp(min=0).view(-1), per_row(v.temperature),
                         per_row(v.top_k) if filtered else None, per_row(v.top_p) if filtered else None, n=n)
    return Logprobs(out.token.view(b, k1), out.top_ids.view(b, k1, n), out.top.view(b, k1, n))


def verify_features(logits: torch.Tensor, v: VerifyInputs, m: MaskInputs, tokenizer_vocab: int, mode: Mode,
                    f: Features, draft_probs: torch.Tensor | None = None) -> tuple[VerifyOutputs, Logprobs | None]:
    """verify_step with the step's features around it (module docstring); the penalty counts are
    updated in place with the tokens each penalized lane emits. logits: [(B+G) K1, V] float32;
    draft_probs: verify_step's (a draft model's law for its sampled drafts)."""
    b, k1 = v.drafts.shape[0], v.drafts.shape[1] + 1
    x = guide_lanes(logits, f.guide, k1) if f.guide is not None else logits[: b * k1]     # [B K1, V]
    x = x.float()
    if f.penalties is not None:
        x = penalize_lanes(x, *f.penalties, v.drafts, valid_drafts(v, m))
    out = verify_step(x, v, m, tokenizer_vocab, mode, draft_probs)      # masks x in place (float32): the rows verified
    if f.penalties is not None:
        count_tokens_(f.penalties[1], f.penalties[0], out.tokens)
    lp = lane_logprobs(x, out.tokens, v, mode, f.logprobs) if f.logprobs is not None else None
    return out, lp
