"""A packed forward batch: each sequence contributes any number of new tokens at its own positions.

Terms: T = new tokens in all (packed), R = rows whose logits are returned, L = context length of one
sequence (cached + new).

Everything attention needs (where to write K/V, what to gather, the masks) is computed once here,
on the host, and shared by every layer.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import torch

from interlock.models.kv_cache import slots_of
from interlock.protocol.types import BlockId, SeqId, TokenId


class KVLayout(Protocol):
    """Where a sequence's positions live: PagedKVCache, or a BlockTables snapshot of it."""

    @property
    def block_size(self) -> int: ...

    def block_table(self, seq: SeqId) -> tuple[BlockId, ...]: ...

# Chunks up to this many tokens (decode and verify steps) take attention's row path, which is
# bitwise batch-invariant; longer chunks (prompt prefill) take the fused SDPA path.
ROW_PATH_MAX_TOKENS = 16


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
class SeqView:
    """One sequence's part of a packed batch, as attention sees it."""

    offset: int                    # first packed row of this sequence
    length: int                    # new tokens
    start: int                     # position of the first new token
    blocks: torch.Tensor           # [ceil(L / block size)] long: the sequence's KV blocks, in order
    first_slot: int | None         # when those blocks are consecutive: K/V are one slice from here
    mask: torch.Tensor | None      # [length, L] bool causal mask for the SDPA path; None: row path


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor        # [T] long
    positions: torch.Tensor        # [T] long
    write_slots: torch.Tensor      # [T] long: KV slot of each new token
    logit_index: torch.Tensor      # [R] long into [T]
    seqs: tuple[SeqView, ...]
    row_index: torch.Tensor | None     # [T'] long: tokens of row-path chunks (None: all of them)
    dense: tuple[tuple[int, int], ...]  # (offset, length) of each prompt chunk (own GEMM each)
    # Prompt chunks on the rows path too (Transformer.rows_prefill); None: the model's own setting.
    # Per batch, so engines sharing one model may each keep their EngineConfig.prefill.
    all_rows: bool | None = None

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]


def build_batch(chunks: list[SeqChunk], kv: KVLayout, device: torch.device | str = "cpu", *,
                all_rows: bool | None = None) -> ForwardBatch:
    """Pack chunks into one ForwardBatch (host-side index arithmetic, once per step).

    The chunks' positions must already be reserved in the cache that `kv` describes.
    """
    if not chunks:
        raise ValueError("empty batch")
    ids: list[int] = []
    positions: list[int] = []
    write: list[int] = []
    logit_index: list[int] = []
    views: list[SeqView] = []
    for c in chunks:
        n, ctx = len(c.tokens), c.start + len(c.tokens)
        bs = kv.block_size
        table = kv.block_table(c.seq)
        if len(table) * bs < ctx:
            raise IndexError(f"sequence {c.seq} has {len(table) * bs} reserved positions, chunk needs {ctx}")
        table = table[: -(-ctx // bs)]
        mask = None
        if n > ROW_PATH_MAX_TOKENS:     # query at position p sees keys 0..p
            mask = torch.arange(ctx)[None, :] <= torch.arange(c.start, ctx)[:, None]
            mask = mask.to(device)
        consecutive = all(b == table[0] + i for i, b in enumerate(table))
        views.append(SeqView(len(ids), n, c.start, torch.tensor(table, dtype=torch.long, device=device),
                             table[0] * bs if consecutive else None, mask))
        logit_index.extend(len(ids) + r for r in c.logit_rows)
        ids.extend(c.tokens)
        positions.extend(range(c.start, ctx))
        write.extend(slots_of(table, bs, c.start, n))
    dense = tuple((v.offset, v.length) for v in views if v.mask is not None)
    row_index = None
    if dense:
        rows = [v.offset + i for v in views if v.mask is None for i in range(v.length)]
        row_index = torch.tensor(rows, dtype=torch.long, device=device)
    return ForwardBatch(
        row_index=row_index,
        dense=dense,
        input_ids=torch.tensor(ids, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        write_slots=torch.tensor(write, dtype=torch.long, device=device),
        logit_index=torch.tensor(logit_index, dtype=torch.long, device=device),
        seqs=tuple(views),
        all_rows=all_rows,
    )


@dataclass(frozen=True)
class RowSplit:
    """A batch cut in two: its prompt chunks as a batch of their own, and its row-path tokens."""

    dense: ForwardBatch | None      # the prompt chunks (returns no logits); None: there are none
    dense_index: torch.Tensor       # [Td] packed index of each of its tokens in the whole batch
    row_index: torch.Tensor         # [Tr] packed index of each row-path token
    rows: tuple[SeqView, ...]       # the row-path views, offsets counting row tokens only


def split_rows(batch: ForwardBatch, all_rows: bool = False) -> RowSplit:
    """all_rows: every chunk takes the row path, prompt chunks included."""
    rows = tuple(v for v in batch.seqs if v.mask is None or all_rows)
    device = batch.input_ids.device
    if not batch.dense or all_rows:
        return RowSplit(None, torch.zeros(0, dtype=torch.long, device=device),
                        torch.arange(batch.num_tokens, device=device), rows)
    dense_views = [v for v in batch.seqs if v.mask is not None]
    index = torch.cat([torch.arange(v.offset, v.offset + v.length, device=device) for v in dense_views])
    views = _packed(dense_views)
    dense = ForwardBatch(input_ids=batch.input_ids[index], positions=batch.positions[index],
                         write_slots=batch.write_slots[index], logit_index=index[:0], seqs=views,
                         row_index=None, dense=tuple((v.offset, v.length) for v in views))
    row_index = batch.row_index if batch.row_index is not None else index[:0]
    return RowSplit(dense, index, row_index, _packed(rows))


def _packed(views: list[SeqView] | tuple[SeqView, ...]) -> tuple[SeqView, ...]:
    """The views with offsets re-based as if they alone were packed, in order."""
    out, offset = [], 0
    for v in views:
        out.append(replace(v, offset=offset))
        offset += v.length
    return tuple(out)
