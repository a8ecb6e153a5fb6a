"""Model drafters: a draft LM with its own paged KV cache, run one token at a time for K tokens.

One class serves three kinds of drafter:
- a separate checkpoint with the target's tokenizer (`draft:PATH`);
- the layer-skip self-draft: the target's first N layers, then its final norm and head — no extra
  weights, and for the embedded model (which has no smaller sibling) the only model drafter;
- either of them with an EAGLE3-style pruned vocabulary: the head keeps some rows only, and d2t
  maps draft id i to target id d2t[i].

The drafter's cache holds, per request, the committed tokens it has been fed plus this step's
drafts. Committed tokens it has not seen yet are "pending" (the whole prompt at first, then the
accepted tokens of each step); a step feeds pending + the head (grammar-forced tokens), then each
draft in turn. After verification the drafts that were accepted keep their KV, the rest are
rewound, as in the target's cache.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from interlock.models.batch import SeqChunk, build_batch
from interlock.models.kv_cache import PagedKVCache
from interlock.models.linear import select_rows
from interlock.models.llama import Transformer
from interlock.protocol.types import RequestId, TokenId


@dataclass(frozen=True)
class DraftLM:
    """What runs a draft forward: the model, how many of its layers, and an optional pruned head."""

    model: Transformer
    n_layers: int
    head: nn.Module | None = None       # None: the model's own head
    d2t: torch.Tensor | None = None     # [Vd] long: target id of each draft id; None: same vocabulary

    def __post_init__(self) -> None:
        if not 1 <= self.n_layers <= self.model.config.n_layers:
            raise ValueError(f"n_layers must be in 1..{self.model.config.n_layers}, got {self.n_layers}")
        if (self.head is None) != (self.d2t is None):
            raise ValueError("a pruned head and its d2t map go together")

    @classmethod
    def full(cls, model: Transformer) -> DraftLM:
        return cls(model, model.config.n_layers)

    def pruned(self, d2t: torch.Tensor) -> DraftLM:
        """The same drafter over the draft vocabulary d2t (target ids, distinct, increasing or not)."""
        d2t = torch.as_tensor(d2t, dtype=torch.long)
        if d2t.ndim != 1 or not len(d2t) or len(set(d2t.tolist())) != len(d2t):
            raise ValueError("d2t must be a non-empty 1-D tensor of distinct target ids")
        if int(d2t.min()) < 0 or int(d2t.max()) >= self.model.config.vocab_size:
            raise ValueError(f"d2t ids must lie in 0..{self.model.config.vocab_size - 1}")
        assert self.model._head is not None, "build() the model first"
        return replace(self, head=select_rows(self.model._head, d2t), d2t=d2t)

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size if self.d2t is None else len(self.d2t)

    def new_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        return PagedKVCache(replace(self.model.config, n_layers=self.n_layers), num_blocks, block_size)

    def __call__(self, chunks: list[SeqChunk], kv: PagedKVCache) -> torch.Tensor:
        return self.model(build_batch(chunks, kv), kv, n_layers=self.n_layers, head=self.head)


@dataclass
class _Seq:
    seq: int
    pending: list[TokenId]                              # committed, not yet in the cache
    fed: list[TokenId] = field(default_factory=list)    # drafts of this step that are in the cache


class ModelDrafter:
    """Per-request bookkeeping of a DraftLM's cache. Owned by the DraftActor; `feed` runs the model
    (call it off the event loop), everything else is O(tokens touched)."""

    def __init__(self, lm: DraftLM, num_blocks: int, block_size: int) -> None:
        self.lm = lm
        self.kv = lm.new_cache(num_blocks, block_size)
        self._seqs: dict[RequestId, _Seq] = {}
        self._next_seq = 0

    def __contains__(self, request_id: RequestId) -> bool:
        return request_id in self._seqs

    def __len__(self) -> int:
        return len(self._seqs)

    def add(self, request_id: RequestId, prompt: tuple[TokenId, ...]) -> None:
        if request_id in self._seqs:
            raise ValueError(f"request {request_id} is already drafted for")
        self._seqs[request_id] = _Seq(self._next_seq, list(prompt))
        self.kv.add_sequence(self._next_seq)
        self._next_seq += 1

    def remove(self, request_id: RequestId) -> None:
        s = self._seqs.pop(request_id, None)
        if s is not None:
            self.kv.free(s.seq)

    def feed(self, feeds: list[tuple[RequestId, tuple[TokenId, ...]]]) -> torch.Tensor:
        """Append tokens to each request's cache (its pending tokens first, which this consumes) and
        return the draft logits after the last one of each: [len(feeds), Vd]. The tokens count as
        this step's drafts until `commit`."""
        chunks = []
        for request_id, drafts in feeds:
            s = self._seqs[request_id]
            tokens = tuple(s.pending) + tuple(drafts)
            start = self.kv.length(s.seq)
            self.kv.reserve(s.seq, len(tokens))
            chunks.append(SeqChunk(s.seq, tokens, start, (len(tokens) - 1,)))
            s.pending.clear()
            s.fed.extend(drafts)
        return self.lm(chunks, self.kv).clone()     # a normal tensor: the caller masks it in place

    def commit(self, request_id: RequestId, new_tokens: tuple[TokenId, ...]) -> None:
        """The step's outcome: keep the KV of fed drafts that were accepted, rewind the others."""
        s = self._seqs.get(request_id)
        if s is None:
            return
        keep = 0
        while keep < min(len(s.fed), len(new_tokens)) and s.fed[keep] == new_tokens[keep]:
            keep += 1
        self.kv.rewind(s.seq, len(s.fed) - keep)
        s.pending.extend(new_tokens[keep:])
        s.fed.clear()
