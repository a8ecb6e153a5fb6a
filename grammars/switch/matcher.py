"""`SwitchMatcher`: the GrammarMatcher protocol for a `SwitchProgram`, on `BaseMatcher`'s loop.

Phases of the output:
    FREE   free text; tracks the bytes at its end that begin a trigger (a token in which a
           trigger would end before the token does is refused: the switch is on a token boundary)
    BEGIN  after a trigger: the rest of the tag's `begin` (forced where there is one tag)
    INNER  the tag's spec (an inner matcher; EOS refused while an `end` is due)
    END    the tag's `end` marker (forced)
    DONE   `at_most` tags written: only EOS
Rollback is exact because the matcher keeps one immutable state per accepted token (the inner
matcher's depth included) and a rollback pops states. EOS, termination, accepted depth, bounds
checks and the mask loop are `BaseMatcher`'s (grammars/matcher.py): this file supplies its native
primitives over the phases, and `_fill_row` so that a free row is reported free and left unwritten.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from interlock.grammars import bitmask as bm
from interlock.grammars.matcher import BaseMatcher
from interlock.grammars.switch.compiler import CompiledTag, SwitchProgram
from interlock.grammars.triggers import FIRE, REFUSE
from interlock.models.tokenizer import Tokenizer
from interlock.protocol.grammar import GrammarBackend, GrammarSpec, StructuralTag
from interlock.protocol.types import TokenId

MAX_FORCED = 256             # forced tokens looked ahead in one call (a marker plus a JSON header)
FREE, BEGIN, INNER, END, DONE = "free", "begin", "inner", "end", "done"


@dataclass(frozen=True)
class Segment:
    """A run of accepted tokens of one kind.

    kind: "free" (thinking, or text between tags), "marker" (a trigger with the rest of its begin,
    or an end marker), "constrained" (a tag's spec, or Reasoning's answer), "eos".
    tag: the tag's index in the program for marker and constrained runs. complete: a constrained
    run that its end marker (or EOS, for Reasoning's answer) closed.
    """

    kind: str
    ids: tuple[TokenId, ...]
    tag: int | None = None
    complete: bool = False
    spec: GrammarSpec | None = None


@dataclass(frozen=True)
class _State:
    """Everything after one accepted token. The inner matcher is shared between the states of one
    tag; `depth` is how far it had accepted here, so rolling back to this state rolls it back to depth."""

    phase: str = FREE
    tail: bytes = b""                        # FREE: longest suffix of its bytes that begins a trigger
    tags: tuple[int, ...] = ()               # BEGIN: tags whose begin matches so far; INNER/END: (tag,)
    pos: int = 0                             # BEGIN / END: marker tokens matched
    inner: Any = None                        # INNER: the tag's matcher (None: free)
    depth: int = 0                           # INNER: inner.num_accepted at this state
    count: int = 0                           # tags begun
    spent: int = 0                           # FREE: tokens so far (the reasoning budget)
    forcing: tuple[TokenId, ...] = ()        # FREE over the budget: the end marker's tokens still due
    span: int = 0                            # BEGIN / INNER entered by a trigger: the tokens it spanned


class SwitchMatcher(BaseMatcher):
    """The GrammarMatcher protocol for a SwitchProgram (see the module docstring). The native
    primitives below never see EOS: `BaseMatcher` allows it exactly when `_native_accepting`."""

    def __init__(self, program: SwitchProgram, backend: GrammarBackend, tokenizer: Tokenizer) -> None:
        super().__init__(vocab_size=backend.vocab_size, tokenizer_vocab=tokenizer.vocab_size,
                         eos_token_ids=tokenizer.eos_token_ids)
        self.program = program
        self._backend = backend
        assert program.scan is not None, "compile_switch sets the trigger scan"
        self._scan = program.scan
        self._states: list[_State] = [self._initial()]
        self._ids: list[TokenId] = []               # the accepted tokens before any EOS (segments())
        self._eos_id: TokenId | None = None         # the EOS that terminated (segments())
        self._scratch = bm.allocate_bitmask(1, backend.vocab_size)

    # --- queries ---------------------------------------------------------------------------------

    @property
    def phase(self) -> str:
        """"free", "begin", "inner", "end" or "done" (for the stream and tests)."""
        return self._states[-1].phase

    def is_free(self) -> bool:
        """Every tokenizer id is allowed now (a mask row here may be skipped)."""
        s = self._states[-1]
        if self._terminated:
            return False
        if s.phase == FREE:
            return self.program.free_eos and not self._over_budget(s) and not self._scan.refused[s.tail]
        if s.phase == INNER and self._tag(s).end is None:
            return s.inner is None or (hasattr(s.inner, "is_free") and s.inner.is_free())
        return False

    def marker_hints(self) -> list[TokenId]:
        """Tokens that advance a marker here (next token of each trigger or of the begin/end being
        matched). For test walks, which would seldom spell a multi-token trigger by chance."""
        s = self._states[-1]
        if self._terminated:
            return []
        if s.phase == FREE:                       # the rest of the trigger begun, else any trigger
            return [s.forcing[0]] if s.forcing else self._scan.hints(s.tail)
        if s.phase == BEGIN:
            return sorted({self.program.tags[i].begin[s.pos] for i in s.tags})
        if s.phase == END:
            return [self._end(s)[s.pos]]
        if s.phase == INNER and self._tag(s).end is not None and s.inner.is_accepting():
            return [self._end(s)[0]]
        if s.phase == INNER and s.inner is not None and hasattr(s.inner, "marker_hints"):
            return s.inner.marker_hints()
        return []

    def segments(self) -> list[Segment]:
        """The accepted tokens split by phase (token-level, so exactly where the grammar switched).
        A constrained run whose spec is itself a switching grammar is split by its own segments."""
        runs: list[tuple[str, list[TokenId], int | None]] = []      # (role, ids, tag)
        for i, t in enumerate(self._ids):
            before, after = self._states[i], self._states[i + 1]
            if before.phase == FREE and after.phase in (BEGIN, INNER):
                k = after.span - 1                # the trigger's earlier tokens were taken as free
                free = runs.pop()[1] if k else []
                if len(free) > k:
                    runs.append(("free", free[:-k], None))
                runs.append(("begin", [*free[len(free) - k:], t], after.tags[0]))
                continue
            if before.phase == FREE:
                role = "free"
            elif before.phase == BEGIN:
                role = "begin"
            elif before.phase == END or (before.phase == INNER and after.phase != INNER):
                role = "end"
            else:
                role = "constrained"
            tag = after.tags[0] if role == "begin" else (None if role == "free" else before.tags[0])
            if runs and runs[-1][0] == role and not (role == "end" and before.phase == INNER):
                runs[-1] = (role, [*runs[-1][1], t], tag if role == "begin" else runs[-1][2])
            else:
                runs.append((role, [t], tag))
        if self._terminated:
            runs.append(("eos", [self._eos_id], None))      # type: ignore[list-item]
        kinds = {"begin": "marker", "end": "marker"}
        return self._close([Segment(kinds.get(role, role), tuple(ids), tag) for role, ids, tag in runs])

    def _close(self, runs: list[Segment]) -> list[Segment]:
        out: list[Segment] = []
        for n, seg in enumerate(runs):
            if seg.kind != "constrained":
                out.append(seg)
                continue
            tag = self.program.tags[seg.tag]                 # type: ignore[index]
            nxt = runs[n + 1].kind if n + 1 < len(runs) else None
            done = nxt == "marker" if tag.end is not None else nxt == "eos"
            if isinstance(tag.spec, StructuralTag) and self._states[-1].inner is not None:
                out.extend(self._states[-1].inner.segments())   # Reasoning's answer holds tags
                continue
            out.append(replace(seg, complete=done, spec=tag.spec))
        return out

    # --- BaseMatcher's primitives -----------------------------------------------------------------

    def accept(self, token_ids: Sequence[TokenId]) -> bool:
        ids = [int(t) for t in token_ids]
        ok = super().accept(ids)
        if ok and self._terminated:
            self._eos_id = ids[-1]
        return ok

    def _native_validate(self, token_ids: list[TokenId]) -> int:
        n = 0
        try:
            for t in token_ids:
                if not self._step(t):
                    break
                n += 1
        finally:
            self._pop(n)
        return n

    def _native_consume(self, token_ids: list[TokenId]) -> None:
        for t in token_ids:
            if not self._step(t):              # validated just before: a refusal is a bug
                raise RuntimeError(f"switch matcher refused token {t} that it had validated")

    def _native_rollback(self, n: int) -> None:
        self._pop(n)

    def _native_reset(self) -> None:
        self._states = [self._initial()]
        self._ids = []

    def _native_accepting(self) -> bool:
        s = self._states[-1]
        if s.phase == DONE:
            return True
        if s.phase == FREE:
            return self.program.free_eos
        if s.phase == INNER:
            return self._tag(s).end is None and (s.inner is None or s.inner.is_accepting())
        return False

    def _native_forced(self) -> list[TokenId]:
        out: list[TokenId] = []
        try:
            while len(out) < MAX_FORCED:
                step = self._forced_here()
                taken = 0
                for t in step[:MAX_FORCED - len(out)]:
                    if not self._step(t):
                        break
                    taken += 1
                out.extend(step[:taken])
                if taken == 0:
                    break
        finally:
            self._pop(len(out))
        return out

    def _fill_row(self, bitmask: torch.Tensor, row: int, *, write_free: bool) -> bool:
        """A free row is reported free and written (every tokenizer id) only when write_free."""
        if not self.is_free():
            return super()._fill_row(bitmask, row, write_free=write_free)
        if write_free:
            bitmask[row].fill_(-1)
            bm.clear_ids_from(bitmask, row, self._tokenizer_vocab, self._vocab_size)
        return True

    def _native_fill(self, bitmask: torch.Tensor, row: int) -> None:
        """The row for the current (not free, not terminated) state; EOS bits and padding are
        `BaseMatcher`'s to set."""
        s = self._states[-1]
        if self._over_budget(s):
            bm.set_only(bitmask, row, [self._budget_next(s)])
        elif s.phase == FREE:                     # free text, but a trigger may not end mid-token
            bitmask[row].copy_(self._scan.rows[s.tail])
        elif s.phase == DONE:
            bm.clear_row(bitmask, row)
        elif s.phase == BEGIN:
            bm.set_only(bitmask, row, sorted({self.program.tags[i].begin[s.pos] for i in s.tags}))
        elif s.phase == END:
            bm.set_only(bitmask, row, [self._end(s)[s.pos]])
        else:
            self._fill_inner(s, bitmask, row)

    # --- internals ----------------------------------------------------------------------------

    def _tag(self, s: _State) -> CompiledTag:
        return self.program.tags[s.tags[0]]

    def _end(self, s: _State) -> tuple[TokenId, ...]:
        end = self._tag(s).end
        assert end is not None                  # END and end hints only exist for tags with an end
        return end

    def _pop(self, n: int) -> None:
        if n <= 0:
            return
        del self._states[len(self._states) - n:]
        del self._ids[len(self._ids) - n:]
        top = self._states[-1]
        if top.inner is not None and top.inner.num_accepted != top.depth:
            top.inner.rollback(top.inner.num_accepted - top.depth)

    def _push(self, state: _State) -> bool:
        self._states.append(state)
        return True

    def _step(self, t: TokenId) -> bool:
        """Accept one token (push a state) or refuse it (state unchanged)."""
        if self._step_state(t):
            self._ids.append(t)
            return True
        return False

    def _step_state(self, t: TokenId) -> bool:
        s = self._states[-1]
        if s.phase == DONE or not 0 <= t < self._tokenizer_vocab:
            return False                          # after the last tag only EOS, which is BaseMatcher's
        if s.phase == FREE:
            if self._over_budget(s) and t != self._budget_next(s):
                return False
            state = self._free_step(s, t)
            return state is not None and self._push(state)
        if s.phase == BEGIN:
            tags = tuple(i for i in s.tags if self.program.tags[i].begin[s.pos] == t)
            if not tags:
                return False
            return self._push(self._after_begin(replace(s, tags=tags, pos=s.pos + 1)))
        if s.phase == END:
            end = self._end(s)
            if t != end[s.pos]:
                return False
            if s.pos + 1 < len(end):
                return self._push(replace(s, pos=s.pos + 1))
            done = self.program.at_most is not None and s.count >= self.program.at_most
            return self._push(_State(DONE if done else FREE, count=s.count))
        return self._inner_step(s, t)

    def _free_step(self, s: _State, t: TokenId) -> _State | None:
        """The state after free token t (None: refused, a trigger would end inside it)."""
        kind, out = self._scan.step(s.tail, t)
        if kind == REFUSE:
            return None
        if kind == FIRE:
            assert isinstance(out, int)
            trigger = self.program.triggers[out]
            fired = tuple(i for i, tag in enumerate(self.program.tags) if tag.trigger == trigger)
            span = self._scan.span([*self._ids, t], out)
            return self._after_begin(_State(BEGIN, tags=fired, pos=len(trigger), count=s.count + 1, span=span))
        assert isinstance(out, bytes)
        nxt = _State(FREE, tail=out, count=s.count, spent=s.spent + 1)
        return replace(nxt, forcing=self._forcing(s, nxt)) if self._over_budget(nxt) else nxt

    def _initial(self) -> _State:
        s = _State()
        return replace(s, forcing=self._scan.continuation(b"", 0)) if self._over_budget(s) else s

    def _forcing(self, before: _State, after: _State) -> tuple[TokenId, ...]:
        """Over the budget: the end marker's tokens still due (chosen when the budget ran out)."""
        if self._over_budget(before):
            return before.forcing[1:]
        return self._scan.continuation(after.tail, 0)

    def _over_budget(self, s: _State) -> bool:
        return s.phase == FREE and self.program.budget is not None and s.spent >= self.program.budget

    def _budget_next(self, s: _State) -> TokenId:
        """Over the budget: the next token of the end marker (compile checked one is always due)."""
        return s.forcing[0]

    def _after_begin(self, s: _State) -> _State:
        """Enter the tag's spec once its begin is complete (at most one tag can be: compile checks)."""
        done = [i for i in s.tags if len(self.program.tags[i].begin) == s.pos]
        if not done:
            return s
        tag = self.program.tags[done[0]]
        inner = None if tag.inner is None else self._backend.matcher(tag.inner)
        return _State(INNER, tags=(done[0],), inner=inner, depth=0, count=s.count, span=s.span)

    def _inner_step(self, s: _State, t: TokenId) -> bool:
        tag = self._tag(s)
        accepting = s.inner is None or s.inner.is_accepting()
        if tag.end is not None and accepting and t == tag.end[0]:
            # The end marker wins over the spec when both could take t: decided by state alone,
            # so mask and accept agree.
            if len(tag.end) == 1:
                return self._step_end_done(s)
            return self._push(_State(END, tags=s.tags, pos=1, count=s.count))
        if s.inner is None:
            return self._push(s)
        if not s.inner.accept([t]):
            return False
        return self._push(replace(s, depth=s.inner.num_accepted))

    def _step_end_done(self, s: _State) -> bool:
        done = self.program.at_most is not None and s.count >= self.program.at_most
        return self._push(_State(DONE if done else FREE, count=s.count))

    def _fill_inner(self, s: _State, bitmask: torch.Tensor, row: int) -> None:
        tag = self._tag(s)
        if s.inner is None:                       # free answer but not free here: cannot happen
            raise AssertionError("a free inner phase is always free")
        s.inner.fill_mask(bitmask, row)
        if tag.end is not None and s.inner.is_accepting():
            bm.set_bit(bitmask, row, tag.end[0], True)

    def _forced_here(self) -> list[TokenId]:
        s = self._states[-1]
        if s.phase == BEGIN:
            nxt = {self.program.tags[i].begin[s.pos] for i in s.tags}
            return list(nxt) if len(nxt) == 1 else []
        if s.phase == END:
            return list(self._end(s)[s.pos:])
        if self._over_budget(s):
            return list(s.forcing)
        if s.phase != INNER or s.inner is None:
            return []
        forced = s.inner.forced_tokens()
        if forced or self._tag(s).end is None or not s.inner.is_accepting():
            return forced
        # The spec is complete: when it allows nothing more, the end marker is forced.
        s.inner.fill_mask(self._scratch, 0)
        self._set_eos_bits(self._scratch, 0, False)
        return [] if bool(self._scratch[0].any()) else [self._end(s)[0]]
