"""The grammar-conditional law's inert data: what one attempt knows (TrieView) and what it saw (Visit).

Terms (docs/speculation.md, "Two laws"): P the model's law of outputs (temperature / top-k / top-p on
the unmasked logits), L the grammar's complete outputs. A node is an output prefix; p(c | n) the
model's probability of token c after n; a(c) 1 if the grammar allows c after n, else 0. The live mass
of a node, L(n), is what earlier attempts have not proved dead under it: 1 for a node no attempt has
drawn from; for one some attempt drew from (its mask is known),
    L(n) = sum over allowed c of p(c | n) * L(c)     (unexplored children count 1).
An attempt draws at a known node with weights p(c | n) a(c) L(c) (normalised, they sum to L(n)),
and at an unknown node from p itself; a drawn token the grammar refuses ends it as a rejection.

A TrieView is a frozen snapshot, taken before an attempt starts: what the attempt learns is applied
only to later attempts, which is what makes each attempt's proposal P(x) 1[x not known dead] / L(root)
exactly (so an accepted output is an exact sample of P(x | x in L)).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, TypeAlias

from interlock.protocol.types import TokenId

Law: TypeAlias = Literal["masked", "conditional"]
LAWS: tuple[Law, ...] = ("masked", "conditional")
ROOT = 0                                    # the empty output's node


@dataclass(frozen=True)
class Visit:
    """One token of an attempt, as the row it was drawn from saw it (the VerifierActor records it).

    p: the model's p(token | prefix); allowed_mass: sum of p over the ids the grammar allowed there
    (the row's stop rule included: at the last position only a stop token is allowed)."""

    token: TokenId
    p: float
    allowed_mass: float


@dataclass(frozen=True)
class TrieView:
    """The known nodes at the start of an attempt: node -> {token: (child node, L(child))} over the
    children some attempt walked into (a known node without explored children maps to {})."""

    children: Mapping[int, Mapping[TokenId, tuple[int, float]]] = field(
        default_factory=lambda: MappingProxyType({}))

    def known(self, node: int | None) -> bool:
        """Some earlier attempt drew from this node: its mask (the grammar's refusals) applies."""
        return node is not None and node in self.children

    def child(self, node: int | None, token: TokenId) -> int | None:
        """The node after `token`, None when no attempt walked there (nor below it)."""
        if node is None:
            return None
        hit = self.children.get(node, {}).get(token)
        return None if hit is None else hit[0]

    def live(self, node: int) -> Mapping[TokenId, float]:
        """token -> L(child) over a known node's explored children."""
        return {t: lv for t, (_, lv) in self.children.get(node, {}).items()}
