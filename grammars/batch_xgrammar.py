"""xgrammar's part of the batched step pass (grammars/batch.py), over its BatchGrammarMatcher.

xgrammar fills one row per matcher per batch call, so a step takes one call per draft position:
fill row j of every request, advance every request by its draft j, and so on; one batch rollback
ends it. The check advances the same way without filling (xgrammar has no validate-without-advance).
A friend of XGrammarMatcher: it drives the native matcher and the bookkeeping BaseMatcher keeps.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import xgrammar as xgr

from interlock.grammars.batch_parts import Drafted, mark_filled
from interlock.grammars.xgrammar_backend import XGrammarMatcher
from interlock.protocol.types import TokenId


class XGrammarBatch:
    matcher_type = XGrammarMatcher
    min_batch = 2               # one request: its own accept/fill calls beat the batch set-up (mask_bench)

    def __init__(self, threads: int) -> None:
        self._batch = xgr.BatchGrammarMatcher(threads)

    @staticmethod
    def takes(m: XGrammarMatcher) -> bool:
        return not m.is_terminated()

    def reset(self) -> None:
        pass                                    # nothing is kept between calls

    def validate(self, requests: Sequence[Drafted[XGrammarMatcher]], bitmask: torch.Tensor) -> list[int]:
        reach, ends, _, _ = self._walk(requests, None)
        return [k + e for k, e in zip(reach, ends)]

    def fill(self, requests: Sequence[Drafted[XGrammarMatcher]], bitmask: torch.Tensor, free: Any) -> list[int]:
        ms = [r.matcher for r in requests]
        reach, ends, filled, owners = self._walk(requests, bitmask)
        self._finish(ms, filled, owners, bitmask)
        n = [k + e for k, e in zip(reach, ends)]
        terminated = [r.start_row + k for r, k, e in zip(requests, n, ends) if e and k not in r.skip]
        if terminated:
            bitmask[torch.tensor(terminated)] = 0           # after EOS nothing is allowed
        mark_filled(free, filled + terminated)
        return [1 + k for k in n]

    def _walk(self, requests: Sequence[Drafted[XGrammarMatcher]], bitmask: torch.Tensor | None
              ) -> tuple[list[int], list[bool], list[int], list[int]]:
        """Advance every request through its drafts, one batch call per position, filling row j
        before draft j when bitmask is given; stop each at its first refused draft; roll back.
        Returns (reach: drafts the native matcher took, ends: an EOS followed them and the grammar
        accepts there, the rows filled, the request of each filled row)."""
        ms = [r.matcher for r in requests]
        split = [m._split(r.drafts) for m, r in zip(ms, requests)]
        offered = [m._offered(body) for m, (body, _) in zip(ms, split)]
        reach, ends = [0] * len(ms), [False] * len(ms)
        filled: list[int] = []
        owners: list[int] = []
        going = list(range(len(ms)))
        j = 0
        while going:
            if bitmask is not None:
                at = [i for i in going if j not in requests[i].skip]
                if at:
                    rows = [requests[i].start_row + j for i in at]
                    self._batch.batch_fill_next_token_bitmask([ms[i]._m for i in at], bitmask, rows)
                    filled += rows
                    owners += at
            step = [i for i in going if j < len(offered[i])]
            for i in going:
                body, eos_next = split[i]
                if j == len(offered[i]) and j == len(body) and eos_next and ms[i]._m.is_completed():
                    ends[i] = True                          # the EOS after the body (never sent to xgrammar)
            going = []
            if step:
                results = xgr.BatchGrammarMatcher.batch_accept_token([ms[i]._m for i in step],
                                                                     [int(offered[i][j]) for i in step])
                going = [i for i, good in zip(step, results) if good]
            j += 1
            for i in going:
                reach[i] = j
        _rollback(ms, reach)
        return reach, ends, filled, owners

    def accept(self, matchers: Sequence[XGrammarMatcher], tokens: Sequence[Sequence[TokenId]]) -> list[bool]:
        ok = [True] * len(matchers)
        bodies: list[list[TokenId]] = []
        ends: list[bool] = []
        for i, (m, ts) in enumerate(zip(matchers, tokens)):
            ids = [int(t) for t in ts]
            body, eos_next = m._split(ids)
            # anything but "body, then at most one EOS" is refused, as accept's validate refuses it
            ok[i] = len(body) + eos_next == len(ids) and len(m._offered(body)) == len(body)
            bodies.append(body if ok[i] else [])
            ends.append(eos_next)
        advanced = _advance(matchers, bodies)
        undo = [0] * len(matchers)
        for i, m in enumerate(matchers):
            if not ok[i]:
                continue
            ok[i] = advanced[i] == len(bodies[i]) and (not ends[i] or m._m.is_completed())
            if ok[i]:
                m._consumed(len(bodies[i]) + ends[i], ends[i])
            else:
                undo[i] = advanced[i]
        _rollback(matchers, undo)
        return ok

    @staticmethod
    def _finish(ms: Sequence[XGrammarMatcher], filled: list[int], owners: list[int], bitmask: torch.Tensor) -> None:
        """_fill_checked's rules for the natively filled rows (owners[k]: the request of filled[k]):
        the JSON control filter, then EOS bits and padding (BaseMatcher._finish_rows)."""
        if not filled:
            return
        rows = torch.tensor(filled)
        accepting = ms[0]._accepting_rows(bitmask, rows)    # before the filter touches any bit
        by_filter: dict[int, tuple[Any, list[int]]] = {}
        for row, i in zip(filled, owners):
            control = ms[i]._control
            if control is not None:
                by_filter.setdefault(id(control), (control, []))[1].append(row)
        for control, picked in by_filter.values():
            block = (torch.tensor(picked)[:, None], control.columns[None, :])    # [rows, words keep changes]
            bitmask[block] = bitmask[block] & control.keep_columns
        touched = any(t in control.banned for control, _ in by_filter.values() for t in ms[0]._eos)
        ms[0]._finish_rows(bitmask, rows, accepting, touched)


def _advance(ms: Sequence[XGrammarMatcher], seqs: Sequence[Sequence[TokenId]]) -> list[int]:
    """Advance each matcher by its tokens, one batch call per position, stopping at the first
    refused one; returns how far each went."""
    advanced = [0] * len(ms)
    alive = [i for i, s in enumerate(seqs) if s]
    j = 0
    while alive:
        results = xgr.BatchGrammarMatcher.batch_accept_token([ms[i]._m for i in alive],
                                                             [int(seqs[i][j]) for i in alive])
        j += 1
        still = []
        for i, good in zip(alive, results):
            if good:
                advanced[i] = j
                if j < len(seqs[i]):
                    still.append(i)
        alive = still
    return advanced


def _rollback(ms: Sequence[XGrammarMatcher], counts: Sequence[int]) -> None:
    back = [i for i, k in enumerate(counts) if k]
    if back:
        xgr.BatchGrammarMatcher.batch_rollback([ms[i]._m for i in back], [counts[i] for i in back])
