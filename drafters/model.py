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

`DraftRounds` is one step's draft loop over a ModelDrafter: it cannot be one `propose` call
(drafters/base.py says why), so the DraftActor runs it as K rounds of `forward` (model lane),
the draft-side mask row (grammar lane), `sample` (model lane). Per-request draft generators live
in the ModelDrafter: same seed, same drafts.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from interlock.models.batch import SeqChunk, build_batch
from interlock.models.kv_cache import PagedKVCache
from interlock.models.linear import select_rows
from interlock.kernels.sampling import draw_draft, request_generator
from interlock.models.llama import Transformer
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.types import RequestId, TokenId


@dataclass(frozen=True)
class DraftLM:
    """What runs a draft forward: the model, how many of its layers, and an optional pruned head."""

    model: Transformer
    n_layers: int
    head: nn.Module | None = None       # None: the model's own head
    d2t: torch.Tensor | None = None     # [Vd] long: target id of each draft id; None: same vocabulary
    all_rows: bool | None = None        # prompt chunks on the rows path (None: the model's setting)

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
        return PagedKVCache(self.model.config.first_layers(self.n_layers), num_blocks, block_size)

    def __call__(self, chunks: list[SeqChunk], kv: PagedKVCache) -> torch.Tensor:
        return self.model(build_batch(chunks, kv, all_rows=self.all_rows), kv, n_layers=self.n_layers, head=self.head)


@dataclass
class _Seq:
    seq: int
    pending: list[TokenId]                              # committed, not yet in the cache
    fed: list[TokenId] = field(default_factory=list)    # drafts of this step that are in the cache


class ModelDrafter:
    """Per-request bookkeeping of a DraftLM's cache and draft generators (drafters.base.Tracked).
    Owned by the DraftChain; `feed` runs the model (on the model lane), everything else is
    O(tokens touched)."""

    def __init__(self, lm: DraftLM, num_blocks: int, block_size: int, eos_token_ids: tuple[int, ...] = (),
                 prefill_chunk: int = 256) -> None:
        self.lm = lm
        self.kv = lm.new_cache(num_blocks, block_size)
        self.prefill_chunk = prefill_chunk      # the target's (actors/step/planner.py), see _prefill
        self.eos = frozenset(eos_token_ids)     # a draft stops after one of these
        self._seqs: dict[RequestId, _Seq] = {}
        self._next_seq = 0
        self._generators: dict[RequestId, torch.Generator] = {}    # sampled drafts, seeded per request

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
        self._generators.pop(request_id, None)
        s = self._seqs.pop(request_id, None)
        if s is not None:
            self.kv.free(s.seq)

    def counts(self) -> dict[str, int]:
        return {"draft_requests": len(self._seqs), "draft_generators": len(self._generators),
                "draft_kv_free_blocks": self.kv.num_free_blocks, "draft_kv_total_blocks": self.kv.num_blocks}

    def generator(self, request_id: RequestId, sampling: SamplingParams) -> torch.Generator | None:
        """A sampled request's own draft stream, seeded from its seed (salted: not the verifier's)."""
        if sampling.greedy:
            return None
        gen = self._generators.get(request_id)
        if gen is None:
            gen = self._generators[request_id] = request_generator(sampling.seed, salt=0x5EED)
        return gen

    def feed(self, feeds: list[tuple[RequestId, tuple[TokenId, ...]]]) -> torch.Tensor:
        """Append tokens to each request's cache (its pending tokens first, which this consumes) and
        return the draft logits after the last one of each: [len(feeds), Vd]. The tokens count as
        this step's drafts until `commit`."""
        chunks = []
        for request_id, drafts in feeds:
            s = self._seqs[request_id]
            self._prefill(s)
            tokens = tuple(s.pending) + tuple(drafts)
            start = self.kv.length(s.seq)
            self.kv.reserve(s.seq, len(tokens))
            chunks.append(SeqChunk(s.seq, tokens, start, (len(tokens) - 1,)))
            s.pending.clear()
            s.fed.extend(drafts)
        return self.lm(chunks, self.kv).clone()     # a normal tensor: the caller masks it in place

    def _prefill(self, s: _Seq) -> None:
        """A new prompt's tokens but the last, in the chunks the target prefills them in.

        On the dense prompt path (no rows_prefill) the GEMMs round a row differently for another
        chunk length; chunked as the target's, the draft's prompt K/V are bitwise the target's, so a
        draft model that is the target proposes exactly the target's tokens (a bf16 KV cache turns
        the last-bit differences of unaligned chunks into whole bf16 steps)."""
        if self.kv.length(s.seq) or len(s.pending) <= 1:
            return
        body, c = s.pending[:-1], self.prefill_chunk
        for offset in range(0, len(body), c):
            part = tuple(body[offset: offset + c])
            start = self.kv.reserve(s.seq, len(part))
            self.lm([SeqChunk(s.seq, part, start, ())], self.kv)
        del s.pending[:-1]

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


@dataclass(frozen=True)
class ModelAsk:
    """One request the draft model continues this step."""

    request_id: RequestId
    head: tuple[TokenId, ...]       # the forced tokens it drafts after (already cut to k)
    k: int                          # draft tokens in all, the head included
    sampling: SamplingParams


class DraftRounds:
    """One step's draft-model loop, keyed by the caller's slots.

    Each round: `forward` feeds every request still drafting (its pending tokens and head first, then
    its last draft) and leaves one row of `logits` per slot in `order`; the caller may mask those
    rows in place (draft-side masking); `sample` draws one draft per row. A request stops at k
    tokens, at an end-of-sequence token, or when its row allows nothing.
    """

    def __init__(self, drafter: ModelDrafter, asks: dict[int, ModelAsk], vocab_size: int) -> None:
        self.drafter = drafter
        self.asks = asks
        self.vocab_size = vocab_size            # the tokenizer's: drafts never go past it
        self.out: dict[int, list[TokenId]] = {slot: list(a.head) for slot, a in asks.items()}
        self._q: dict[int, list[torch.Tensor]] = {slot: [] for slot in asks}
        self._feeds = {slot: a.head for slot, a in asks.items() if len(a.head) < a.k}
        self.order: list[int] = []              # the slots whose rows `logits` holds
        self.logits: torch.Tensor | None = None

    def forward(self) -> list[int]:
        """One draft forward for every request still drafting; returns their slots (rows of logits)."""
        self.order, self.logits = list(self._feeds), None
        if self.order:
            self.logits = self.drafter.feed([(self.asks[slot].request_id, self._feeds[slot]) for slot in self.order])
        return self.order

    def sample(self) -> None:
        """One draft per row of `logits` (already masked where the grammar says so)."""
        self._feeds = {}
        if self.logits is None:
            return
        d, vocab = self.drafter, self.vocab_size
        for row, slot in enumerate(self.order):
            a = self.asks[slot]
            token, q = draw_draft(self.logits[row], a.sampling, d.generator(a.request_id, a.sampling), vocab, d.lm.d2t)
            if token is None:           # the grammar allows nothing more (or refused the prefix)
                continue
            self.out[slot].append(token)
            if q is not None:
                self._q[slot].append(q)
            if len(self.out[slot]) < a.k and token not in d.eos:
                self._feeds[slot] = (token,)

    def result(self, slot: int) -> tuple[tuple[TokenId, ...], torch.Tensor | None]:
        """The drafts and their q [len, V] (point masses for the head; None for a greedy request)."""
        out, q_rows = self.out[slot], self._q[slot]
        if not q_rows:
            return tuple(out), None
        head = len(out) - len(q_rows)
        q = torch.zeros(len(out), self.vocab_size)
        q[torch.arange(head), torch.tensor(out[:head], dtype=torch.long)] = 1.0
        q[head:] = torch.stack(q_rows)
        return tuple(out), q
