"""Trie: what a law="conditional" request's attempts have proved about the grammar, per request.

Terms as in protocol/conditional.py. A node exists once some attempt drew from it; it holds A(n),
the model's mass on the ids the grammar allows there (the rest is the mass its refused children
took away), and its explored children, each with p(c | n). Its live mass is
    L(n) = A(n) - sum over explored children c of p(c | n) * (1 - L(c)),
what is left of the model's mass under n once every known-dead continuation is removed (an
unexplored child counts L = 1). `record` adds one attempt's path and updates L bottom-up along it;
`freeze` gives the next attempt its frozen TrieView.

Memory: at most `max_nodes` nodes. A full trie stops learning (the rest of a path is not recorded):
attempts stay exact, since a proposal that knows less is still P(x) 1[x not known dead] for what it
knows, and only get no cheaper; SamplingParams.max_attempts bounds them.
"""
from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

from interlock.protocol.conditional import ROOT, TrieView, Visit
from interlock.protocol.types import TokenId


class Trie:
    def __init__(self, max_nodes: int) -> None:
        if max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
        self.max_nodes = max_nodes
        self.allowed: list[float] = []                          # A(n)
        self.live: list[float] = []                             # L(n)
        self.children: list[dict[TokenId, tuple[int, float]]] = []   # token -> (child, p(token | n))
        self._views: dict[int, MappingProxyType] = {}           # node -> its frozen children map

    def __len__(self) -> int:
        return len(self.allowed)

    @property
    def live_mass(self) -> float:
        """L(root): the model's mass not yet proved outside the grammar (1 before any attempt)."""
        return self.live[ROOT] if self.live else 1.0

    def record(self, visits: Sequence[Visit]) -> None:
        """One rejected attempt's path: visits[i] was drawn at the node after visits[:i]; the last
        one was refused there (so it is no child: its node's A already leaves it out)."""
        path: list[int] = []
        node: int | None = self._node(None, None, visits[0].allowed_mass) if visits else None
        for i, v in enumerate(visits):
            if node is None:
                break
            path.append(node)
            if i + 1 < len(visits):
                node = self._node(node, v, visits[i + 1].allowed_mass)
        for n in reversed(path):
            dead = sum(p * (1.0 - self.live[c]) for c, p in self.children[n].values())
            self.live[n] = max(self.allowed[n] - dead, 0.0)
        for n in path:                  # their maps hold the L of the path's children, just changed
            self._views[n] = MappingProxyType({t: (c, self.live[c]) for t, (c, _) in self.children[n].items()})

    def freeze(self) -> TrieView:
        """The next attempt's snapshot (a copy of the node index; the per-node maps are shared, read-only)."""
        return TrieView(MappingProxyType(dict(self._views)))

    def _node(self, parent: int | None, visit: Visit | None, allowed_mass: float) -> int | None:
        """The root (parent None) or parent's child by visit.token, made if new; None when full."""
        if parent is not None and visit is not None and visit.token in self.children[parent]:
            return self.children[parent][visit.token][0]
        if parent is None and self.allowed:
            return ROOT
        if len(self.allowed) >= self.max_nodes:
            return None
        node = len(self.allowed)
        self.allowed.append(allowed_mass)
        self.live.append(allowed_mass)
        self.children.append({})
        self._views[node] = MappingProxyType({})
        if parent is not None and visit is not None:
            self.children[parent][visit.token] = (node, visit.p)
        return node
