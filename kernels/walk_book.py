"""WalkBook: the VerifierActor's per-request walk through a law="conditional" attempt's trie.

An attempt is one internal request carrying a frozen TrieView (protocol/conditional.py). Its walk is
the node of its committed output (None once it left the known part of the trie: nothing below is
known either), its depth, and the Visits of its tokens so far. Each step, `target` turns the
request's K+1 verify rows of model probabilities into the trie-adjusted law
(kernels/conditional.py) that verification accepts drafts against, and `settle` records the tokens
the step emitted, ending the attempt at the first one the grammar refuses (an AttemptRefused that
carries every Visit, for the driver to learn from). The stop rule: a complete output has at most
max_tokens - 1 tokens before its stop token, so at depth max_tokens - 1 only stop tokens count as
allowed. Like the PenaltyBook, the book is used only on the model lane; its walks go when the request is released.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from interlock.kernels.conditional import allowed_mass, conditional_target, live_weights
from interlock.protocol.conditional import ROOT, Visit
from interlock.protocol.errors import AttemptRefused
from interlock.protocol.messages import RequestSnapshot
from interlock.protocol.types import RequestId, TokenId


@dataclass
class _Walk:
    node: int | None = ROOT
    depth: int = 0                       # output tokens committed
    visits: list[Visit] = field(default_factory=list)


class WalkBook:
    def __init__(self, stop_ids: Sequence[TokenId]) -> None:
        self.stop_ids = torch.tensor(sorted(stop_ids), dtype=torch.long)
        self.walks: dict[RequestId, _Walk] = {}

    def __len__(self) -> int:
        return len(self.walks)

    def release(self, request_id: RequestId) -> None:
        self.walks.pop(request_id, None)

    def target(self, s: RequestSnapshot, drafts: Sequence[TokenId], p: torch.Tensor,
               allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(target [n+1, V], allowed [n+1, V] with the stop rule) for request s's rows: row j is the
        node after the committed output and drafts[:j]; p [n+1, V] the model's law there."""
        assert s.trie is not None
        walk = self.walks.setdefault(s.request_id, _Walk())
        nodes = [walk.node]
        for d in drafts:
            nodes.append(s.trie.child(nodes[-1], d))
        allowed = self._stop_rule(allowed, walk.depth, s.sampling.max_tokens)
        known = torch.tensor([s.trie.known(n) for n in nodes], dtype=torch.bool)
        live = [s.trie.live(n) if n is not None and s.trie.known(n) else {} for n in nodes]
        return conditional_target(p, live_weights(allowed, known, live)), allowed

    def settle(self, s: RequestSnapshot, tokens: Sequence[TokenId], p: torch.Tensor,
               allowed: torch.Tensor) -> AttemptRefused | None:
        """Record the step's tokens (token j drawn at row j of `p` / `allowed`, as `target` gave
        them); the attempt's refusal if one of them is refused there (the tokens after it are moot)."""
        assert s.trie is not None
        walk = self.walks.setdefault(s.request_id, _Walk())
        mass = allowed_mass(p[: len(tokens)], allowed[: len(tokens)]).tolist()
        for j, t in enumerate(tokens):
            walk.visits.append(Visit(t, float(p[j, t]), mass[j]))
            if not bool(allowed[j, t]):
                return AttemptRefused(tuple(walk.visits))
            walk.node = s.trie.child(walk.node, t)
            walk.depth += 1
        return None

    def _stop_rule(self, allowed: torch.Tensor, depth: int, max_tokens: int) -> torch.Tensor:
        """Rows at depth >= max_tokens - 1 allow only stop tokens (and only where the grammar does)."""
        last = max_tokens - 1 - depth                  # the first row at the last position
        if last >= allowed.shape[0]:
            return allowed
        out = allowed.clone()
        keep = torch.zeros(allowed.shape[1], dtype=torch.bool)
        keep[self.stop_ids[self.stop_ids < allowed.shape[1]]] = True
        out[max(last, 0):] &= keep
        return out
