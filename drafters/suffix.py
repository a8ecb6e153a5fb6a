"""Suffix drafting (SuffixDecoding, arXiv 2411.04975): drafts from everything the engine has seen.

Terms used below:
  D        = config.max_depth: the longest substring a trie indexes (so the longest suffix matched)
  seq      = one live request's prompt + committed output; it only grows
  context  = seq followed by tokens assumed to come next (grammar-forced tokens), not indexed
  node(s)  = the trie node of substring s (the path from the root); count(s) = occurrences of s
  m        = match length: the longest suffix of the context found in a trie with room for a
             k-token draft below it (m <= D - k)
  p(t | s) = count(s + t) / sum over u of count(s + u): how often t followed s, among the
             occurrences of s that something followed (the request's own latest one has no
             continuation yet and is no evidence either way)
  score    = sum over a draft's tokens of the product of p along its path, i.e. the expected
             number of accepted tokens if the trie's frequencies were the target's

Two tries of one kind (`SuffixTrie`, every substring of up to D tokens with its count):
- one per live request over its prompt + output, grown as tokens are committed;
- one global trie over the outputs of finished requests, each after the last D tokens of its prompt,
  bounded by config.max_global_tokens and evicted oldest first. Structured-output workloads repeat
  the same keys, shapes and values across requests; that is what the global trie remembers and
  prompt lookup (one request) cannot. With its prompt's tail, an output is found from its first
  token when the same prompt comes again (a retry, an evaluation's repeated runs); a tail shared by
  many prompts (the chat template's) is followed there by many outputs, so it drafts little.

A proposal walks from the longest match greedily to the most frequent child (ties: the most recently
seen), while the path probability stays >= config.min_token_prob, for at most
min(K, ceil(config.max_spec_factor * m)) tokens (K: the step's lookup budget), or, beyond K, at most m
tokens up to config.max_long_draft: a long match earns a long draft, a 1-token match a short one.
Beyond K only the match length counts (SuffixDecoding's draft length = match length): a prompt or
output seen before matches long and drafts long, while a key seen in other documents (a short match,
followed there by their values) stays within K. The request's trie and the global trie each propose; the higher
score wins (the request's
own on a tie). Drafts are point masses: verification stays exact whatever they are.

Costs: appending a token touches D nodes (the suffixes ending at it); a proposal does O(D^2) dict
lookups to find the match and O(k) to draft. Memory: at most D nodes per indexed token, usually far
fewer (repeated substrings share nodes).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial

from interlock.drafters.combine import after_forced
from interlock.protocol.errors import RequestError
# SuffixConfig lives in the protocol (it is a SpeculativeConfig field); re-exported here.
from interlock.protocol.speculative import DraftRequest, SuffixConfig
from interlock.protocol.types import RequestId, TokenId


@dataclass(frozen=True)
class Draft:
    tokens: tuple[TokenId, ...]
    score: float
    match: int                  # m: how many context tokens matched
    # Per draft token, up to `siblings` other children of the same node, most frequent first: what
    # a tree of candidates would verify beside it (issue 13 measured one: none pays on a CPU,
    # docs/speculation.md); () unless asked.
    siblings: tuple[tuple[TokenId, ...], ...] = ()


_ROOT = 0
_NONE = -1                       # no token: token ids are >= 0


class SuffixTrie:
    """Every substring of up to `max_depth` tokens of the sequences added, with occurrence counts.

    `append()` grows a sequence token by token; `add()` / `remove()` take a whole one (remove undoes
    add exactly and frees nodes whose count drops to 0, so nothing is left behind).

    Nodes are ints indexing flat lists of ints, which CPython's collector does not walk (one object
    per node, the first version, put ~500k tracked objects on the heap over 50 prompts: the drafter
    then cost ~0.7 ms a step on a 2-core CPU, mostly in garbage collections, against ~0.1 ms this
    way). Most nodes of a depth-limited suffix trie have one child (a substring seen once goes on one
    way), so a node keeps its only child in two list slots and gets a {token: node} dict only when a
    second child comes. A dict per node made the global trie at its bound (50,000 output tokens of
    JSONSchemaBench instances, depth 24, tracemalloc) 111 MB; this way it is 39 MB, indexing a
    314-token prompt plus 60 output tokens takes 2.1 ms instead of 2.7, and evicting an output is 3x
    faster (`remove` walks each start's path once).
    """

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.nodes = 0                              # live nodes, excluding the root
        self.clock = 0
        self._count: list[int] = [0]                # occurrences of the node's substring
        self._last: list[int] = [0]                 # insertion clock of its latest occurrence (ties: recency)
        self._tok: list[int] = [_NONE]              # its only child's token (_NONE: no child, or a dict)
        self._one: list[int] = [0]                  # its only child
        self._kids: list[dict[TokenId, int] | None] = [None]   # {token: child} for 2+ children
        self._used = 1                              # slots handed out (the lists hold more, zeroed)
        self._free: list[int] = []                  # ids of freed nodes, reused first

    def append(self, ends: list[int], token: TokenId) -> list[int]:
        """Index `token` after the substrings `ends` (the nodes of the suffixes ending before it, longest
        first, at most D - 1 of them); return the nodes of the suffixes ending at it (longest first)."""
        self.clock += 1
        clock, count, last, tok, one, kids = self.clock, self._count, self._last, self._tok, self._one, self._kids
        out = []
        child: int | None
        for node in ends[-(self.max_depth - 1):] + [_ROOT]:     # the longest (D tokens) cannot grow
            if tok[node] == token:
                child = one[node]
            else:
                children = kids[node]
                child = children.get(token) if children is not None else None
                if child is None:          # a new node, set up inline: this is the trie's hot loop
                    if self._free:
                        child = self._free.pop()    # freed childless: count 0, _tok _NONE, _kids None
                    else:
                        child = self._used
                        if child == len(count):
                            self._grow()
                        self._used = child + 1
                    self.nodes += 1
                    if children is not None:
                        children[token] = child
                    elif tok[node] == _NONE:
                        tok[node], one[node] = token, child
                    else:                                       # a second child: a dict takes both
                        kids[node] = {tok[node]: one[node], token: child}
                        tok[node] = _NONE
            count[child] += 1
            last[child] = clock
            out.append(child)
        return out

    def _grow(self) -> None:
        """Double the lists in place (the callers' local names stay bound to them)."""
        n = len(self._count)
        for column in (self._count, self._last, self._one):
            column.extend([0] * n)
        self._tok.extend([_NONE] * n)
        self._kids.extend([None] * n)

    def _unlink(self, node: int, token: TokenId) -> None:
        if self._tok[node] == token:
            self._tok[node] = _NONE
            return
        children = self._kids[node]
        assert children is not None
        del children[token]
        if len(children) == 1:                      # one child left: back into the list slots
            ((t, child),) = children.items()
            self._tok[node], self._one[node], self._kids[node] = t, child, None

    def _child(self, node: int, token: TokenId) -> int | None:
        if self._tok[node] == token:
            return self._one[node]
        children = self._kids[node]
        return children.get(token) if children is not None else None

    def _children(self, node: int) -> Iterable[tuple[TokenId, int]]:
        children = self._kids[node]
        if children is not None:
            return children.items()
        t = self._tok[node]
        return ((t, self._one[node]),) if t != _NONE else ()

    def _has_children(self, node: int) -> bool:
        return self._tok[node] != _NONE or self._kids[node] is not None

    def add(self, tokens: Iterable[TokenId]) -> None:
        ends: list[int] = []
        for t in tokens:
            ends = self.append(ends, t)

    def remove(self, tokens: Sequence[TokenId]) -> None:
        """Undo `add(tokens)`: decrement every substring occurrence it counted, free empty nodes.

        The substrings starting at one position are the prefixes of one path from the root, so each
        start walks that path once (O(n D), not a walk per substring) and decrements it deepest first:
        an occurrence of s + t is one of s, so a child's count never exceeds its parent's, and a node
        that reaches 0 has no children left.
        """
        d, count = self.max_depth, self._count
        for start in range(len(tokens)):
            path, node = [], _ROOT
            for t in tokens[start:start + d]:
                child = self._child(node, t)
                assert child is not None, "suffix trie: removing a sequence it does not hold"
                path.append((node, t, child))
                node = child
            for parent, t, node in reversed(path):
                count[node] -= 1
                if count[node] == 0:
                    assert not self._has_children(node), "suffix trie counts out of order"
                    self._unlink(parent, t)
                    self._free.append(node)
                    self.nodes -= 1

    def count(self, path: Sequence[TokenId]) -> int:
        node = self._find(path)
        return self._count[node] if node is not None else 0

    def substrings(self) -> dict[tuple[TokenId, ...], int]:
        """Every indexed substring with its count (for tests and debugging: walks the whole trie)."""
        out: dict[tuple[TokenId, ...], int] = {}
        stack: list[tuple[tuple[TokenId, ...], int]] = [((), _ROOT)]
        while stack:
            path, node = stack.pop()
            for t, child in self._children(node):
                out[path + (t,)] = self._count[child]
                stack.append((path + (t,), child))
        return out

    def _find(self, path: Sequence[TokenId]) -> int | None:
        node = _ROOT
        for t in path:
            child = self._child(node, t)
            if child is None:
                return None
            node = child
        return node

    def match(self, context: Sequence[TokenId], room: int = 1) -> tuple[int, int | None]:
        """The longest suffix of `context` in the trie with `room` more levels below it (so at most
        D - room tokens, and up to `room` tokens can follow it in a draft)."""
        n = len(context)
        for start in range(max(0, n - self.max_depth + room), n):
            node = self._find(context[start:])
            if node is not None and self._has_children(node):
                return n - start, node
        return 0, None

    def propose(self, context: Sequence[TokenId], k: int, factor: float, min_prob: float, *,
                short: int | None = None, long: int = 0, siblings: int = 0) -> Draft:
        """At most k tokens: up to min(short, ceil(factor * m)) after an m-token match, or up to
        min(m, long) when that is more (short defaults to k). siblings: also keep, per draft token,
        up to this many runners-up among its node's children (Draft.siblings)."""
        if k <= 0:
            return Draft((), 0.0, 0)
        # Match at most D - k tokens: the trie holds nothing deeper than D, so a match of D - 1 could
        # only ever draft one token, and long matches are the likeliest to be right. Offline replay of
        # 50 JME and 50 repeated-schema outputs (no forced tokens), K = 3: acceptance 1.88 -> 2.12
        # and 2.13 -> 2.22 against matching up to D - 1.
        m, node = self.match(context, min(k, self.max_depth - 1))
        if node is None:
            return Draft((), 0.0, m)
        short = k if short is None else short
        budget = min(k, max(min(short, math.ceil(factor * m)), min(m, long)), self.max_depth - m)
        count, last = self._count, self._last
        tokens: list[TokenId] = []
        others: list[tuple[TokenId, ...]] = []
        prob, score = 1.0, 0.0

        def rank(kv: tuple[TokenId, int]) -> tuple[int, int]:       # most frequent, then most recent
            return count[kv[1]], last[kv[1]]

        while len(tokens) < budget and self._has_children(node):
            children = self._children(node)
            token, child = max(children, key=rank)
            p = prob * count[child] / sum(count[c] for _, c in children)
            if p < min_prob:
                break
            tokens.append(token)
            if siblings:
                runners_up = sorted((kv for kv in children if kv[0] != token), key=rank, reverse=True)
                others.append(tuple(t for t, _ in runners_up[:siblings]))
            prob, score, node = p, score + p, child
        return Draft(tuple(tokens), score, m, tuple(others))


class SuffixDrafter:
    """Drafts from each request's own tokens and from the outputs of finished requests.

    A Drafter and Tracked (drafters/base.py), like NGramDrafter: add(prompt), commit(tokens),
    propose(requests, k) (the forced tokens, then `lookup` past them), remove() (which hands the
    request's output to the global trie). Not thread-safe; the DraftChain calls it on the model lane.
    """

    def __init__(self, config: SuffixConfig, max_draft_len: int, lookup_len: int | None = None) -> None:
        """max_draft_len: the largest k a caller may ask for; lookup_len: K, the draft length any match
        may have (default max_draft_len); beyond it only long matches draft (config.max_long_draft)."""
        if max_draft_len < 1:
            raise ValueError(f"max_draft_len must be >= 1, got {max_draft_len}")
        self.config = config
        self.max_draft_len = max_draft_len
        self.lookup_len = max_draft_len if lookup_len is None else lookup_len
        self._seqs: dict[RequestId, list[TokenId]] = {}
        self._prompt_len: dict[RequestId, int] = {}
        self._tries: dict[RequestId, SuffixTrie] = {}
        self._ends: dict[RequestId, list[int]] = {}
        self.global_trie = SuffixTrie(config.max_depth)
        self._global: OrderedDict[int, tuple[TokenId, ...]] = OrderedDict()   # finished outputs, oldest first
        self._global_tokens = 0
        self._next_output = 0

    # --- lifecycle -------------------------------------------------------------------------

    def add(self, request_id: RequestId, prompt_tokens: Sequence[TokenId]) -> None:
        if request_id in self._seqs:
            raise RequestError(f"suffix drafter already holds request {request_id!r}")
        self._seqs[request_id] = []
        self._prompt_len[request_id] = len(prompt_tokens)
        self._tries[request_id] = SuffixTrie(self.config.max_depth)
        self._ends[request_id] = []
        self.commit(request_id, prompt_tokens)

    def commit(self, request_id: RequestId, accepted_tokens: Iterable[TokenId]) -> None:
        seq, trie = self._seq(request_id), self._tries[request_id]
        ends = self._ends[request_id]
        for t in accepted_tokens:
            seq.append(t)
            ends = trie.append(ends, t)
        self._ends[request_id] = ends

    def remove(self, request_id: RequestId) -> None:
        """Forget a request (idempotent); its output, after its prompt's last D tokens, joins the
        global trie (nothing when it has no output)."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return
        prompt_len = self._prompt_len.pop(request_id)
        # Measured on 12 JME prompts, each run 3 times (suffix+forced): steps of the repeated runs
        # 154 -> 130 with the prompt's tail, acceptance 10.5 -> 12.3; 16 repeated-schema documents: 524 -> 525.
        output = tuple(seq[max(0, prompt_len - self.config.max_depth):]) if len(seq) > prompt_len else ()
        del self._tries[request_id], self._ends[request_id]
        if 0 < len(output) <= self.config.max_global_tokens:
            self.global_trie.add(output)
            self._global[self._next_output] = output
            self._next_output += 1
            self._global_tokens += len(output)
            while self._global_tokens > self.config.max_global_tokens:
                _, old = self._global.popitem(last=False)
                self.global_trie.remove(old)
                self._global_tokens -= len(old)

    # --- drafting ---------------------------------------------------------------------------

    def lookup(self, request_id: RequestId, k: int, *, after: Sequence[TokenId] = ()) -> list[TokenId]:
        """Up to k draft tokens continuing the request's sequence followed by `after`; [] on no match."""
        return list(self.lookup_draft(request_id, k, after=after).tokens)

    def lookup_draft(self, request_id: RequestId, k: int, *, after: Sequence[TokenId] = (),
                     siblings: int = 0) -> Draft:
        """`lookup`'s winning Draft (the request's trie's or the global one's), with `siblings`
        runners-up per token (SuffixTrie.propose)."""
        if not 0 <= k <= self.max_draft_len:
            raise ValueError(f"k must be in 0..{self.max_draft_len}, got {k}")
        seq = self._seq(request_id)
        if k == 0:
            return Draft((), 0.0, 0)
        d = self.config.max_depth
        context = seq[-d:] + list(after[-d:]) if after else seq[-d:]
        c = self.config
        rules = dict(short=self.lookup_len, long=c.max_long_draft, siblings=siblings)
        own = self._tries[request_id].propose(context, k, c.max_spec_factor, c.min_token_prob, **rules)
        shared = self.global_trie.propose(context, k, c.max_spec_factor, c.min_token_prob, **rules)
        return shared if shared.score > own.score else own

    def propose(self, requests: Sequence[DraftRequest], k: int) -> list[list[TokenId]]:
        return [after_forced(r.forced, k, partial(self._lookup_after, r.request_id)) for r in requests]

    def _lookup_after(self, request_id: RequestId, k: int, head: Sequence[TokenId]) -> list[TokenId]:
        return self.lookup(request_id, k, after=head)

    def counts(self) -> dict[str, int]:
        s = self.stats()
        return {"suffix_requests": s.requests, "suffix_request_nodes": s.request_nodes,
                "suffix_global_tokens": s.global_tokens, "suffix_global_nodes": s.global_nodes}

    def stats(self) -> SuffixStats:
        return SuffixStats(requests=len(self._seqs), request_nodes=sum(t.nodes for t in self._tries.values()),
                           global_outputs=len(self._global), global_tokens=self._global_tokens,
                           global_nodes=self.global_trie.nodes)

    def _seq(self, request_id: RequestId) -> list[TokenId]:
        seq = self._seqs.get(request_id)
        if seq is None:
            raise RequestError(f"suffix drafter holds no request {request_id!r}")
        return seq


@dataclass(frozen=True)
class SuffixStats:
    """Sizes of the drafter's state (for metrics and leak checks)."""

    requests: int            # live requests (per-request tries)
    request_nodes: int       # nodes over all per-request tries
    global_outputs: int      # finished outputs the global trie holds
    global_tokens: int
    global_nodes: int
