"""A packed forward batch: each sequence contributes any number of new tokens at its own positions.

Terms: B = sequences, T = new tokens in all (packed), Q = most new tokens of one sequence,
K = longest context (cached + new) of one sequence, R = rows whose logits are returned.

Everything the attention needs (where to write K/V, what to gather, the mask, how to pad and
unpad queries) is computed once here and shared by every layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from interlock.models.kv_cache import PagedKVCache
from interlock.protocol.types import SeqId, TokenId


@dataclass(frozen=True)
class SeqChunk:
    """New tokens of one sequence. Positions [start, start + len(tokens)) must be reserved in the cache.

    logit_rows: offsets into `tokens` whose next-token logits the caller wants (e.g. (n-1,) for a
    prefill, range(K+1) for a verify step, () for a prefill chunk that is not the last).
    """

    seq: SeqId
    tokens: tuple[TokenId, ...]
    start: int
    logit_rows: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.tokens:
            raise ValueError("a chunk needs at least one token")
        if any(not 0 <= r < len(self.tokens) for r in self.logit_rows):
            raise ValueError(f"logit_rows {self.logit_rows} outside 0..{len(self.tokens) - 1}")


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor        # [T] long
    positions: torch.Tensor        # [T] long
    write_slots: torch.Tensor      # [T] long: KV slot of each new token
    kv_index: torch.Tensor         # [B, K] long: KV slot of each context position (0 where padded)
    mask: torch.Tensor | None      # [B, 1, Q, K] bool, None when no position needs masking
    pad_index: torch.Tensor | None     # [B*Q] long into [T + 1] (row T is zeros); None when B == 1
    unpad_index: torch.Tensor | None   # [T] long into [B*Q]; None when B == 1
    logit_index: torch.Tensor      # [R] long into [T]
    num_seqs: int
    max_new: int

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]


def build_batch(chunks: list[SeqChunk], kv: PagedKVCache, device: torch.device | str = "cpu") -> ForwardBatch:
    """Pack chunks into one ForwardBatch (host-side index arithmetic, once per step)."""
    if not chunks:
        raise ValueError("empty batch")
    ids: list[int] = []
    positions: list[int] = []
    write: list[int] = []
    logit_index: list[int] = []
    ctx = [c.start + len(c.tokens) for c in chunks]
    max_new = max(len(c.tokens) for c in chunks)
    max_ctx = max(ctx)
    kv_index = torch.zeros(len(chunks), max_ctx, dtype=torch.long)
    for b, c in enumerate(chunks):
        n = len(c.tokens)
        logit_index.extend(len(ids) + r for r in c.logit_rows)
        ids.extend(c.tokens)
        positions.extend(range(c.start, c.start + n))
        all_slots = kv.slots(c.seq, 0, ctx[b])
        write.extend(all_slots[c.start:])
        kv_index[b, : ctx[b]] = torch.tensor(all_slots, dtype=torch.long)

    # Causal mask over absolute positions: query at position p sees keys 0..p of its own sequence.
    q_pos = torch.full((len(chunks), max_new), -1, dtype=torch.long)
    for b, c in enumerate(chunks):
        q_pos[b, : len(c.tokens)] = torch.arange(c.start, c.start + len(c.tokens))
    k_pos = torch.arange(max_ctx)
    mask = k_pos[None, None, :] <= q_pos[:, :, None]            # [B, Q, K]
    mask[:, :, 0] = True                                         # padded query rows: avoid all-masked NaN
    needs_mask = not (len(chunks) == 1 and max_new == 1)

    pad_index = unpad_index = None
    if len(chunks) > 1:
        pad = torch.full((len(chunks), max_new), len(ids), dtype=torch.long)
        unpad: list[int] = []
        offset = 0
        for b, c in enumerate(chunks):
            n = len(c.tokens)
            pad[b, :n] = torch.arange(offset, offset + n)
            unpad.extend(range(b * max_new, b * max_new + n))
            offset += n
        pad_index = pad.view(-1).to(device)
        unpad_index = torch.tensor(unpad, dtype=torch.long, device=device)

    return ForwardBatch(
        input_ids=torch.tensor(ids, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        write_slots=torch.tensor(write, dtype=torch.long, device=device),
        kv_index=kv_index.to(device),
        mask=mask[:, None].to(device) if needs_mask else None,
        pad_index=pad_index,
        unpad_index=unpad_index,
        logit_index=torch.tensor(logit_index, dtype=torch.long, device=device),
        num_seqs=len(chunks),
        max_new=max_new,
    )
