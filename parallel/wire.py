"""A ForwardBatch as plain ints (what a tensor-parallel step sends to every rank) and back.

Everything in a ForwardBatch is host-side index arithmetic, a few ints per token; only the SDPA
masks of prompt chunks are big ([n, L] bool), and those are a function of (start, length), so the
receiving rank rebuilds them instead of receiving them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from interlock.models.batch import ForwardBatch, SeqView


@dataclass(frozen=True)
class WireSeq:
    offset: int
    length: int
    start: int
    blocks: tuple[int, ...]
    first_slot: int | None
    masked: bool                    # prompt chunk: the SDPA path with a causal mask


@dataclass(frozen=True)
class WireBatch:
    input_ids: tuple[int, ...]
    positions: tuple[int, ...]
    write_slots: tuple[int, ...]
    logit_index: tuple[int, ...]
    seqs: tuple[WireSeq, ...]
    row_index: tuple[int, ...] | None
    dense: tuple[tuple[int, int], ...]

    @property
    def num_rows(self) -> int:
        return len(self.logit_index)


def to_wire(batch: ForwardBatch) -> WireBatch:
    seqs = tuple(WireSeq(s.offset, s.length, s.start, tuple(s.blocks.tolist()), s.first_slot, s.mask is not None)
                 for s in batch.seqs)
    return WireBatch(tuple(batch.input_ids.tolist()), tuple(batch.positions.tolist()),
                     tuple(batch.write_slots.tolist()), tuple(batch.logit_index.tolist()), seqs,
                     None if batch.row_index is None else tuple(batch.row_index.tolist()), batch.dense)


def from_wire(w: WireBatch, device: torch.device | str = "cpu") -> ForwardBatch:
    def longs(values: tuple[int, ...]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    views = []
    for s in w.seqs:
        mask = None
        if s.masked:                # as build_batch makes it: query at position p sees keys 0..p
            ctx = s.start + s.length
            mask = (torch.arange(ctx)[None, :] <= torch.arange(s.start, ctx)[:, None]).to(device)
        views.append(SeqView(s.offset, s.length, s.start, longs(s.blocks), s.first_slot, mask))
    return ForwardBatch(longs(w.input_ids), longs(w.positions), longs(w.write_slots), longs(w.logit_index),
                        tuple(views), None if w.row_index is None else longs(w.row_index), w.dense)
