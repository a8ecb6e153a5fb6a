"""One draft-model round of the device runner as one fixed-shape function: each lane's draft token
from its draft logits, under its grammar row, or its forced token.

Terms: B lanes, Vd draft vocabulary (a pruned head's, or the target's), V the target's vocabulary
(the tokenizer's ids are 0 .. vocab-1), W int32 words per bitmask row.

Per lane, in this order:
- `forced[b] >= 0`: the token is forced (a grammar-forced head token): q is a point mass on it;
- otherwise the draft logits are masked by the lane's grammar row (target ids, read through d2t for
  a pruned head) where `masked[b]`, ids past the tokenizer never; a greedy lane (temperature 0)
  takes the argmax (lowest id on ties), a sampled one draws by inverse CDF with `uniforms[b]` from
  the temperature / top-k / top-p distribution, which is its q (over the target's ids);
- a lane whose row allows nothing draws nothing (`drawn[b]` False).

It decides what `kernels.sampling.draw_draft` decides for one row, for every lane at once, with no
host read: what the device runner's captured step runs between two draft forwards.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from interlock.kernels.bitmask import apply_token_bitmask_
from interlock.kernels.sampling import inverse_cdf, probs_from_logits


@dataclass(frozen=True)
class DraftDraw:
    tokens: torch.Tensor        # [B] int64: target ids (0 where nothing was drawn)
    q: torch.Tensor | None      # [B, V] float32: the draw's law over target ids (None: every lane greedy)
    drawn: torch.Tensor         # [B] bool


def sample_drafts(logits: torch.Tensor, rows: torch.Tensor, masked: torch.Tensor, forced: torch.Tensor,
                  temperature: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                  uniforms: torch.Tensor, vocab: int, d2t: torch.Tensor | None = None,
                  greedy: bool = False) -> DraftDraw:
    """logits [B, Vd], rows [B, W] (each lane's grammar row), masked / forced [B], temperature / top_k /
    top_p / uniforms [B]; `greedy`: every lane greedy (no q). See the module docstring."""
    b = logits.shape[0]
    x = logits.float().clone()                                                     # [B, Vd]
    ids = torch.arange(x.shape[1], device=x.device) if d2t is None else d2t       # [Vd] target ids
    x.masked_fill_((ids >= vocab).unsqueeze(0), float("-inf"))
    apply_token_bitmask_(x, rows, skip=~masked, d2t=d2t, mask_vocab_size=vocab, backend="capturable")
    drawn = torch.isfinite(x).any(-1)                                              # [B]
    if greedy:
        pick = x.argmax(-1)
        q = None
    else:
        safe = torch.where(drawn.unsqueeze(1), x, torch.zeros_like(x))             # a dead row draws nothing
        p = probs_from_logits(safe, temperature, top_k, top_p, backend="capturable")   # [B, Vd]
        pick = inverse_cdf(p, uniforms)
        q = x.new_zeros(b, vocab + 1)                                              # column V: ids past the vocabulary
        q.scatter_add_(1, ids.clamp(max=vocab).unsqueeze(0).expand(b, -1), p)
        q = q[:, :vocab]
    tokens = ids[pick]                                                             # [B] target ids
    is_forced = forced >= 0
    tokens = torch.where(is_forced, forced, torch.where(drawn, tokens, torch.zeros_like(tokens)))
    drawn = drawn | is_forced
    if q is not None:
        point = torch.zeros_like(q).scatter_(1, forced.clamp(min=0).unsqueeze(1), 1.0)
        q = torch.where(is_forced.unsqueeze(1), point, q)
    return DraftDraw(tokens, q, drawn)
