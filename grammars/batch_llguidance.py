"""llguidance's part of the batched step pass (grammars/batch.py), over its LLExecutor.

One `fill_next_token_bitmask_par_with_draft_tokens` call fills every draft position of every
request, in parallel. The check needs those masks anyway (a draft is valid when llguidance's own
validate_tokens takes it *and* the mask before it allows it: LLGuidanceMatcher._native_validate),
so the check fills the rows and the fill only marks them; the commit checks the sampled token
against the row the sampler read and consumes one position of every request per parallel call.
A friend of LLGuidanceMatcher: it drives the native matcher and the bookkeeping BaseMatcher keeps.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llguidance
import torch

from interlock.grammars import bitmask as bm
from interlock.grammars import llguidance_calls
from interlock.grammars.batch_parts import Drafted, mark_filled
from interlock.grammars.llguidance_backend import LLGuidanceMatcher
from interlock.protocol.types import TokenId


@dataclass(frozen=True)
class Filled:
    """Rows start_row .. start_row + n hold the masks after drafts[:j] (this step, this depth)."""

    matcher: LLGuidanceMatcher          # held, so its id is not reused while this is kept
    bitmask: torch.Tensor
    depth: int
    start_row: int
    drafts: tuple[TokenId, ...]
    n: int


class LLGuidanceBatch:
    matcher_type = LLGuidanceMatcher

    def __init__(self, threads: int) -> None:
        self._executor = llguidance.LLExecutor(threads)
        self._filled: dict[int, Filled] = {}    # id(matcher) -> its rows this step

    @staticmethod
    def takes(m: LLGuidanceMatcher) -> bool:
        return not m.is_terminated() and not m._m.is_error()

    def reset(self) -> None:
        self._filled.clear()

    def validate(self, requests: Sequence[Drafted[LLGuidanceMatcher]], bitmask: torch.Tensor) -> list[int]:
        """n per request; writes rows 0..n of each (rows past n may be written too: never read)."""
        ms = [r.matcher for r in requests]
        split = [m._split(r.drafts) for m, r in zip(ms, requests)]
        self._fill_par(ms, requests, [body for body, _ in split], bitmask)
        cut = self._mask_cuts(requests, [body for body, _ in split], bitmask)
        n = [0] * len(ms)
        native: list[int] = []
        terminated: list[int] = []
        for i, (m, r, (body, eos_next)) in enumerate(zip(ms, requests, split)):
            if m._m.is_error():
                # A mask where nothing extends the output stops llguidance (LLGuidanceMatcher's
                # docstring): rebuild it and let the per-row path do this request.
                m._rewind(0)
                n[i] = m.validate(r.drafts)
                continue
            k = min(cut[i], m._m.validate_tokens(body) if body else 0)
            ends = eos_next and k == len(body) and bool(m._accepting_rows(bitmask, torch.tensor([r.start_row + k]))[0])
            native += range(r.start_row, r.start_row + k + 1)
            if ends:
                terminated.append(r.start_row + k + 1)
            n[i] = k + ends
            self._filled[id(m)] = Filled(m, bitmask, m.num_accepted, r.start_row, r.drafts, n[i])
        if native:
            rows = torch.tensor(native)
            ms[0]._finish_rows(bitmask, rows, ms[0]._accepting_rows(bitmask, rows))
        if terminated:
            bitmask[torch.tensor(terminated)] = 0           # after EOS nothing is allowed
        return n

    def fill(self, requests: Sequence[Drafted[LLGuidanceMatcher]], bitmask: torch.Tensor, free: Any) -> list[int]:
        missing = [r for r in requests if self._held(r) is None]
        if missing:
            self.validate(missing, bitmask)
        out: list[int] = []
        written: list[int] = []
        for r in requests:
            held = self._held(r)
            if held is None:                                # the per-row path took it (see validate)
                out.append(r.matcher.fill_masks(bitmask, r.start_row, r.drafts, r.skip, free=free))
                continue
            n = min(held.n, len(r.drafts))
            written += [r.start_row + j for j in range(n + 1) if j not in r.skip]
            out.append(1 + n)
        mark_filled(free, written)
        return out

    def accept(self, matchers: Sequence[LLGuidanceMatcher], tokens: Sequence[Sequence[TokenId]]) -> list[bool]:
        """Tokens that continue this step's drafts are checked against the step's rows (as the
        per-row accept checks each against its mask) and llguidance's validate_tokens; others
        take the per-row path."""
        ok: list[bool] = [False] * len(matchers)
        probe: dict[int, list[tuple[int, int, int]]] = {}      # id(bitmask) -> (request, row, token)
        masks: dict[int, torch.Tensor] = {}
        for i, (m, ts) in enumerate(zip(matchers, tokens)):
            ids = [int(t) for t in ts]
            held = self._filled.get(id(m))
            a = len(ids) - 1
            if not ids:
                ok[i] = True
            elif (held is None or held.matcher is not m or held.depth != m.num_accepted or a > held.n
                  or tuple(ids[:a]) != held.drafts[:a]):
                ok[i] = m.accept(ids)
            elif 0 <= ids[-1] < m._tokenizer_vocab:
                masks[id(held.bitmask)] = held.bitmask
                probe.setdefault(id(held.bitmask), []).append((i, held.start_row + a, ids[-1]))
        bodies: dict[int, list[TokenId]] = {}
        for key, found in probe.items():
            allowed = bm.bits_at(masks[key], torch.tensor([row for _, row, _ in found]),
                                 torch.tensor([t for _, _, t in found])).tolist()
            for (i, _, last), good in zip(found, allowed):
                m = matchers[i]
                ids = [int(t) for t in tokens[i]]
                body = ids[:-1] if last in m._eos else ids
                ok[i] = good and (not body or m._m.validate_tokens(body) == len(body))
                if ok[i]:
                    bodies[i] = body
        self._consume(matchers, bodies)
        for i, body in bodies.items():
            matchers[i]._tokens.extend(body)
            matchers[i]._consumed(len(tokens[i]), len(body) < len(tokens[i]))
        return ok

    def _consume(self, matchers: Sequence[LLGuidanceMatcher], bodies: dict[int, list[TokenId]]) -> None:
        """One parallel consume per position over the requests with a token there (all validated)."""
        j = 0
        while True:
            at = [(matchers[i]._m, body[j]) for i, body in bodies.items() if j < len(body)]
            if not at:
                return
            if not all(llguidance_calls.consume_token_par(self._executor, at)):
                raise RuntimeError("llguidance refused tokens it had validated")
            j += 1

    def _fill_par(self, ms: Sequence[LLGuidanceMatcher], requests: Sequence[Drafted[LLGuidanceMatcher]],
                  bodies: Sequence[list[TokenId]], bitmask: torch.Tensor) -> None:
        """Rows start_row + j, j = 0..len(body), in parallel (the draft call takes no empty list)."""
        drafted = [(m._m, r.start_row, body) for m, r, body in zip(ms, requests, bodies) if body]
        bare = [(m._m, r.start_row) for m, r, body in zip(ms, requests, bodies) if not body]
        if drafted:
            llguidance_calls.fill_next_token_bitmask_par_with_draft_tokens(self._executor, drafted, bitmask)
        if bare:
            llguidance_calls.fill_next_token_bitmask_par(self._executor, bare, bitmask)

    def _held(self, r: Drafted[LLGuidanceMatcher]) -> Filled | None:
        held = self._filled.get(id(r.matcher))
        if (held is None or held.matcher is not r.matcher or held.depth != r.matcher.num_accepted
                or held.start_row != r.start_row or held.drafts[:len(r.drafts)] != tuple(r.drafts)):
            return None
        return held

    @staticmethod
    def _mask_cuts(requests: Sequence[Drafted[LLGuidanceMatcher]], bodies: Sequence[list[TokenId]],
                   bitmask: torch.Tensor) -> list[int]:
        """Per request, the first j whose draft its row j (native) refuses; len(body) if none."""
        rows = [r.start_row + j for r, body in zip(requests, bodies) for j in range(len(body))]
        if not rows:
            return [0] * len(requests)
        allowed = bm.bits_at(bitmask, torch.tensor(rows), torch.tensor([t for body in bodies for t in body])).tolist()
        cuts, k = [], 0
        for body in bodies:
            mine = allowed[k:k + len(body)]
            cuts.append(mine.index(False) if False in mine else len(body))
            k += len(body)
        return cuts
