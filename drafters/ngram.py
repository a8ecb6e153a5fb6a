"""N-gram (prompt lookup) drafting with TensorRT-LLM's NGram options.

Terms used below:
  N    = config.max_matching_ngram_size: the longest suffix looked up
  D    = max_draft_len: the most tokens one proposal may hold
  k    = tokens asked for in one propose (0 <= k <= D)
  seq  = one request's tokens, prompt + committed output; it only grows
  key  = a tuple of n tokens, 1 <= n <= N
  occurrence (seq, e) of a key: seq[e - n:e] == key and e < len(seq), so at least one token follows
  continuation of an occurrence: seq[e:e + k]

Occurrences point into the live sequence instead of copying tokens out of it. Two things follow:
a continuation that starts near the end is short (it runs up to the current end, into the current
suffix itself, as in TensorRT-LLM) and it grows by itself as tokens are committed, which is what
TensorRT-LLM gets by re-scanning a window and replacing short matches with longer ones; and an
update costs O(N) dict operations per committed token, a propose O(N) lookups, never a rescan.

Options (TensorRT-LLM's NGramDecodingConfig):
  is_keep_all:    keep every occurrence of a key; else keep one (the oldest or newest, below).
  is_use_oldest:  propose the continuation of the oldest occurrence, else of the newest. With
                  is_keep_all, an occurrence whose continuation is shorter than k (it runs into the
                  end) gives way to the next one that has k tokens, looking at most k entries along:
                  TensorRT-LLM likewise drops a pattern's short matches once a longer one exists.
  is_public_pool: one index shared by every request (a request drafts from what others said);
                  else one index per request, freed by remove().
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial

from interlock.drafters.combine import after_forced
from interlock.protocol.errors import RequestError
from interlock.protocol.speculative import DraftRequest, NGramConfig
from interlock.protocol.types import RequestId, TokenId

_Key = tuple[TokenId, ...]
_Occurrence = tuple[list[TokenId], int]  # (seq, e): the continuation starts at seq[e]


@dataclass(frozen=True)
class NGramStats:
    """Sizes of the drafter's state (for metrics and for tests that check memory is freed)."""

    requests: int       # sequences held for live requests
    pools: int          # indexes: 1 when public, else one per live request
    keys: int           # distinct n-grams indexed, over all pools
    occurrences: int    # occurrences stored, over all pools


class _Pool:
    """One index: key -> occurrences, oldest first; keeps one or all per key as configured."""

    __slots__ = ("keep_all", "use_oldest", "table", "occurrences")

    def __init__(self, keep_all: bool, use_oldest: bool) -> None:
        self.keep_all = keep_all
        self.use_oldest = use_oldest
        self.table: dict[_Key, list[_Occurrence]] = {}
        self.occurrences = 0

    def add(self, key: _Key, occ: _Occurrence) -> None:
        found = self.table.get(key)
        if found is None:
            self.table[key] = [occ]
            self.occurrences += 1
        elif self.keep_all:
            found.append(occ)
            self.occurrences += 1
        elif not self.use_oldest:
            found[0] = occ  # one kept per key: the newest replaces it; keeping the oldest ignores it

    def index(self, seq: list[TokenId], e: int, max_n: int) -> None:
        """Index every key of size 1..max_n that ends at e (seq[e] is the token that follows)."""
        for n in range(1, min(max_n, e) + 1):
            self.add(tuple(seq[e - n:e]), (seq, e))

    def choose(self, occs: list[_Occurrence], k: int) -> list[TokenId]:
        """The continuation to propose from one key's occurrences (at most k tokens)."""
        if len(occs) == 1 or not self.keep_all:
            seq, e = occs[0]
            return seq[e:e + k]
        ordered = occs if self.use_oldest else reversed(occs)
        best: list[TokenId] = []
        # Only occurrences less than k from their sequence's end are short (at most k - 1 of them
        # in a private pool), so k + 1 looks find a full one if any; the cap keeps a public pool's
        # lookup O(k) too.
        for i, (seq, e) in enumerate(ordered):
            cont = seq[e:e + k]
            if len(cont) == k:
                return cont
            if len(cont) > len(best):
                best = cont
            if i >= k:
                break
        return best


class NGramDrafter:
    """Prompt-lookup drafts: continue the sequence the way it continued after its own suffix before.

    A Drafter and Tracked (drafters/base.py): add / commit / remove keep the index, `lookup` drafts
    for one request, `propose` for a step's requests. Not thread-safe; the DraftChain calls it on
    the model lane.
    """

    def __init__(self, config: NGramConfig, max_draft_len: int) -> None:
        if max_draft_len < 1:
            raise ValueError(f"max_draft_len must be >= 1, got {max_draft_len}")
        self.config = config
        self.max_draft_len = max_draft_len
        self._seqs: dict[RequestId, list[TokenId]] = {}
        self._pools: dict[RequestId, _Pool] = {}       # private pools, by request
        self._public: _Pool | None = (
            _Pool(config.is_keep_all, config.is_use_oldest) if config.is_public_pool else None
        )

    # --- lifecycle -------------------------------------------------------------------------

    def add(self, request_id: RequestId, prompt_tokens: Sequence[TokenId]) -> None:
        """Start a request's sequence with its prompt and index the prompt's n-grams."""
        if request_id in self._seqs:
            raise RequestError(f"n-gram drafter already holds request {request_id!r}")
        seq: list[TokenId] = list(prompt_tokens)
        pool = self._public
        if pool is None:
            pool = self._pools[request_id] = _Pool(self.config.is_keep_all, self.config.is_use_oldest)
        self._seqs[request_id] = seq
        n = self.config.max_matching_ngram_size
        for e in range(1, len(seq)):
            pool.index(seq, e, n)

    def commit(self, request_id: RequestId, accepted_tokens: Iterable[TokenId]) -> None:
        """Append a step's committed tokens (accepted drafts + the new token) and index them."""
        seq = self._seq(request_id)
        pool = self._pool(request_id)
        n = self.config.max_matching_ngram_size
        for token in accepted_tokens:
            # The key ending at the old end gets its first continuation token now.
            seq.append(token)
            pool.index(seq, len(seq) - 1, n)

    def remove(self, request_id: RequestId) -> None:
        """Forget a request (idempotent). A private pool is freed; a public pool keeps what the
        request taught it (its entries keep the token list they point into alive)."""
        self._seqs.pop(request_id, None)
        self._pools.pop(request_id, None)

    # --- drafting ---------------------------------------------------------------------------

    def lookup(self, request_id: RequestId, k: int, *, after: Sequence[TokenId] = ()) -> list[TokenId]:
        """Up to k draft tokens continuing the request's sequence (followed by `after`); [] on no match.

        Looks up the longest suffix (up to N tokens) first, then shorter ones; the first key found
        decides, even when its continuation is shorter than a shorter key's would be.
        after: tokens assumed to follow the sequence without being committed (grammar-forced
        tokens), so that the draft continues past them; they are not indexed.
        """
        if not 0 <= k <= self.max_draft_len:
            raise ValueError(f"k must be in 0..{self.max_draft_len}, got {k}")
        seq = self._seq(request_id)
        pool = self._pool(request_id)
        if k == 0:
            return []
        n_max = self.config.max_matching_ngram_size
        tail = seq[-n_max:] + list(after[-n_max:]) if after else seq[-n_max:]
        table = pool.table
        for n in range(min(n_max, len(tail)), 0, -1):
            occs = table.get(tuple(tail[-n:]))
            if occs:
                return pool.choose(occs, k)
        return []

    def propose(self, requests: Sequence[DraftRequest], k: int) -> list[list[TokenId]]:
        """The Drafter protocol: each request's forced tokens, then the lookup past them."""
        return [after_forced(r.forced, k, partial(self._lookup_after, r.request_id)) for r in requests]

    def _lookup_after(self, request_id: RequestId, k: int, head: Sequence[TokenId]) -> list[TokenId]:
        return self.lookup(request_id, k, after=head)

    def counts(self) -> dict[str, int]:
        return {"ngram_requests": len(self._seqs)}

    def stats(self) -> NGramStats:
        pools = list(self._pools.values()) + ([self._public] if self._public is not None else [])
        return NGramStats(
            requests=len(self._seqs),
            pools=len(pools),
            keys=sum(len(p.table) for p in pools),
            occurrences=sum(p.occurrences for p in pools),
        )

    # --- helpers ----------------------------------------------------------------------------

    def _seq(self, request_id: RequestId) -> list[TokenId]:
        seq = self._seqs.get(request_id)
        if seq is None:
            raise RequestError(f"n-gram drafter holds no request {request_id!r}")
        return seq

    def _pool(self, request_id: RequestId) -> _Pool:
        return self._public if self._public is not None else self._pools[request_id]
