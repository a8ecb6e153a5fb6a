"""A step's grammar work for the whole batch, one pass per backend: the draft check, the K+1 mask
rows of every constrained request, and the commit of the accepted tokens.

The per-row path (a matcher's own validate / fill_masks / accept) calls the backend once per token
through a few layers of Python; at B = 32 and K = 3 that is 128 fills and as many accepts and
rollbacks, and the Python alone costs as much as the fills. Here each backend gets its own batch
call instead (grammars/batch_xgrammar.py, grammars/batch_llguidance.py): xgrammar's
BatchGrammarMatcher fills one draft position of every request per call, llguidance's executor fills
every position of every request in one call. Anything else (switching grammars, whose free rows
are ours to compute; a terminated matcher; a matcher of another kind) takes its per-row path.

The result is the per-row path's, bit for bit: the same rows written (rows past a request's valid
count excepted, which no reader reads), the same counts, the same free flags, the same matcher
states (tests/grammars/test_batch.py checks it against the per-row path over random batches).

Terms: a request's row j (at start_row + j) is the mask after drafts[:j]; n is how many of its
drafts the grammar allows (the check cuts the rest); it has 1 + n valid rows. What a request's part
of the pass is and what a backend's batch path offers (`Drafted`, `Group`) are batch_parts.py's,
which the backends' files import, so that this file imports them and not the other way round.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from interlock.grammars.batch_llguidance import LLGuidanceBatch
from interlock.grammars.batch_parts import Drafted, Group
from interlock.grammars.batch_xgrammar import XGrammarBatch
from interlock.protocol.grammar import GrammarMatcher, default_mask_threads
from interlock.protocol.types import TokenId

__all__ = ["Drafted", "Group", "RowByRow", "StepMasks"]     # Drafted and Group: batch_parts.py's


class RowByRow:
    """The per-row path: the reference, and the path of every matcher no batch path takes."""

    def takes(self, matcher: Any) -> bool:
        return True

    def reset(self) -> None:
        pass

    def validate(self, requests: Sequence[Drafted[GrammarMatcher]], bitmask: torch.Tensor) -> list[int]:
        return [r.matcher.validate(r.drafts) if r.drafts else 0 for r in requests]

    def fill(self, requests: Sequence[Drafted[GrammarMatcher]], bitmask: torch.Tensor, free: Any) -> list[int]:
        return [r.matcher.fill_masks(bitmask, r.start_row, r.drafts, r.skip, free=free) for r in requests]

    def accept(self, matchers: Sequence[Any], tokens: Sequence[Sequence[TokenId]]) -> list[bool]:
        return [m.accept(t) for m, t in zip(matchers, tokens)]


class StepMasks:
    """The batched pass: `check`, then `fill`, then (after sampling) `commit`, once per step.

    Synchronous and single-threaded from the caller's side (the grammar lane); the backends
    spread their batch calls over `threads` native threads. One pass serves matchers of one
    tokenizer (the engine's), whichever backend made them.
    """

    def __init__(self, threads: int | None = None, batched: bool = True) -> None:
        self.threads = threads or default_mask_threads()
        self.rows = RowByRow()
        # Keyed by the matcher type each group drives; _group hands a group only matchers of its key,
        # which this dict's type cannot say (hence Group[Any]).
        self._groups: dict[type, Group[Any]] = {}
        for group in (XGrammarBatch(self.threads), LLGuidanceBatch(self.threads)) if batched else ():
            self._groups[group.matcher_type] = group       # without them every matcher takes the per-row path

    def check(self, requests: Sequence[Drafted[GrammarMatcher]], bitmask: torch.Tensor) -> list[int]:
        """n per request: how many of its drafts the grammar allows (cut at the first refused one).
        May already write rows 0..n (llguidance checks drafts against its masks); `fill` keeps them."""
        return self._by_group(requests, lambda g, part: g.validate(part, bitmask))

    def fill(self, requests: Sequence[Drafted[GrammarMatcher]], bitmask: torch.Tensor, free: Any = None) -> list[int]:
        """Rows start_row + j for j = 0..n per request, as `GrammarMatcher.fill_masks`; returns 1 + n.
        free: as fill_masks' (a CPU bool tensor or a list): written rows become False, free rows True."""
        return self._by_group(requests, lambda g, part: g.fill(part, bitmask, free))

    def commit(self, matchers: Sequence[GrammarMatcher], tokens: Sequence[Sequence[TokenId]]) -> list[bool]:
        """`accept`, ending the step: its rows are forgotten."""
        try:
            return self.accept(matchers, tokens)
        finally:
            self.reset()

    def accept(self, matchers: Sequence[GrammarMatcher], tokens: Sequence[Sequence[TokenId]]) -> list[bool]:
        """Each matcher accepts its tokens, all or none (as `GrammarMatcher.accept`); False where it
        refuses. The step's rows are kept (a commit left to the next step runs among its rows)."""
        requests = [Drafted(m, tuple(t), 0) for m, t in zip(matchers, tokens)]
        return self._by_group(requests, lambda g, part: g.accept([r.matcher for r in part], [r.drafts for r in part]))

    def reset(self) -> None:
        """Forget this step's rows (the commit ends a step; a step that failed before it, the next
        step's start)."""
        for group in self._groups.values():
            group.reset()

    def _by_group(self, requests: Sequence[Drafted[GrammarMatcher]],
                  run: Callable[[Group[Any], list[Drafted[GrammarMatcher]]], Sequence[Any]]) -> list[Any]:
        parts: dict[int, tuple[Group[Any], list[int]]] = {}
        for i, r in enumerate(requests):
            group = self._group(r.matcher)
            parts.setdefault(id(group), (group, []))[1].append(i)
        out: list[Any] = [None] * len(requests)
        for group, indices in parts.values():
            if len(indices) < getattr(group, "min_batch", 1):
                group = self.rows                           # alone, the per-row path is faster
            for i, value in zip(indices, run(group, [requests[i] for i in indices])):
                out[i] = value
        return out

    def _group(self, matcher: GrammarMatcher) -> Group[Any]:
        group = self._groups.get(type(matcher))
        if group is None or not group.takes(matcher):
            return self.rows
        return group
