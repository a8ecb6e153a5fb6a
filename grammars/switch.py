"""Grammars that switch on mid-output: `Reasoning` and `StructuralTag`, compiled for one backend,
and the matcher that composes free text with the inner specs' own matchers.

Why a composing matcher is the default rather than xgrammar's structural tags or llguidance's Lark
grammars (which `native=True` uses instead, grammars/native_tags.py): (1) a free row must be
reported as free so the verifier skips it, and a native grammar only hands back a filled row; (2)
the two backends define free text differently, so "auto" falling back from one to the other would
change outputs, while here the switch is computed by us, identically on both (triggers matched on
the tokens' bytes, grammars/triggers.py; forced markers as the tokenizer's own token sequence), and
the inner specs still use each backend's native grammar; (3) max_reasoning_tokens and special-token
markers. Rollback is exact because the matcher keeps one immutable state per accepted token (the
inner matcher's depth included) and a rollback pops states.

Phases of the output:
    FREE   free text; tracks the bytes at its end that begin a trigger (a token in which a
           trigger would end before the token does is refused: the switch is on a token boundary)
    BEGIN  after a trigger: the rest of the tag's `begin` (forced where there is one tag)
    INNER  the tag's spec (an inner matcher; EOS refused while an `end` is due)
    END    the tag's `end` marker (forced)
    DONE   `at_most` tags written: only EOS
`Reasoning(then, end=...)` is one tag whose begin is the end marker, whose spec is `then` and
which has no end: the answer runs to EOS. `then=None` leaves the answer free.
"""
from __future__ import annotations

import time
from collections.abc import Container, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from interlock.grammars import bitmask as bm
from interlock.grammars.compiled import CompiledGrammar
from interlock.grammars.triggers import FIRE, REFUSE, TriggerScan, build_scan
from interlock.models.tokenizer import Tokenizer
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import GrammarBackend, GrammarSpec, Reasoning, StructuralTag
from interlock.protocol.types import TokenId

MAX_FORCED = 256             # forced tokens looked ahead in one call (a marker plus a JSON header)
FREE, BEGIN, INNER, END, DONE = "free", "begin", "inner", "end", "done"


# --- compiled form -------------------------------------------------------------------------------

@dataclass(frozen=True)
class CompiledTag:
    """One tag as token ids: begin = trigger + the rest of begin; end None runs to EOS."""

    trigger: tuple[TokenId, ...]
    begin: tuple[TokenId, ...]
    inner: CompiledGrammar | None            # None: free (Reasoning with then=None)
    end: tuple[TokenId, ...] | None
    spec: GrammarSpec | None = None          # what inner was compiled from (the end-of-output check)


@dataclass(frozen=True)
class SwitchProgram:
    """What compiling a switching spec yields (CompiledGrammar.native); shared by requests."""

    triggers: tuple[tuple[TokenId, ...], ...]
    tags: tuple[CompiledTag, ...]
    at_most: int | None
    free_eos: bool                           # may the output end in free text?
    budget: int | None = None                # free tokens before the (single) trigger is forced
    reasoning: tuple[tuple[TokenId, ...], tuple[TokenId, ...]] | None = None  # (start, end) ids
    scan: TriggerScan | None = field(default=None, compare=False)  # the triggers byte-level (compile sets it)


def is_switch(spec: Any) -> bool:
    return isinstance(spec, (Reasoning, StructuralTag))


def marker_ids(tokenizer: Tokenizer, text: str, what: str) -> tuple[TokenId, ...]:
    """The tokenizer's token sequence for marker `text`. Raises GrammarError when there is none
    that decodes back to exactly that text, or when it holds EOS."""
    if not isinstance(text, str) or not text:
        raise GrammarError(f"{what}: a marker must be a non-empty string, got {text!r}")
    ids = tuple(tokenizer.encode(text))
    back = tokenizer.decode(list(ids)) if ids else ""
    if not ids or back != text:
        raise GrammarError(f"{what}: marker {text!r} is not a token sequence of this tokenizer "
                           f"(it encodes to {list(ids)}, which decodes to {back!r})")
    eos = set(tokenizer.eos_token_ids)
    if eos & set(ids):
        raise GrammarError(f"{what}: marker {text!r} contains the end-of-sequence token")
    return ids


def compile_switch(backend: GrammarBackend, tokenizer: Tokenizer, spec: Reasoning | StructuralTag) -> CompiledGrammar:
    """Resolve markers and compile the inner specs with `backend`. Raises GrammarError."""
    start = time.perf_counter()
    if isinstance(spec, Reasoning):
        program, warnings = _reasoning(backend, tokenizer, spec)
    elif isinstance(spec, StructuralTag):
        program, warnings = _structural(backend, tokenizer, spec, inside=None)
    else:
        raise GrammarError(f"not a switching grammar: {type(spec).__name__}")
    program = replace(program, scan=_scan(backend, tokenizer, program, spec))
    inexact = tuple(w for tag in program.tags if tag.inner is not None for w in tag.inner.inexact)
    return CompiledGrammar(backend.name, spec.key, program, time.perf_counter() - start, warnings, inexact)


def _reasoning(backend: GrammarBackend, tokenizer: Tokenizer, spec: Reasoning) -> tuple[SwitchProgram, tuple[str, ...]]:
    start = marker_ids(tokenizer, spec.start, "Reasoning.start")
    end = marker_ids(tokenizer, spec.end, "Reasoning.end")
    if _contains(start, end) or _contains(end, start):
        raise GrammarError("Reasoning: the start and end markers overlap (one holds the other)")
    inner, warnings = None, ()
    if spec.then is not None:
        if isinstance(spec.then, Reasoning):
            raise GrammarError("Reasoning.then: a Reasoning cannot be nested in another")
        inner = _compile_inner(backend, tokenizer, spec.then, "Reasoning.then")
        warnings = inner.warnings
    budget = spec.max_reasoning_tokens
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 0):
        raise GrammarError(f"Reasoning.max_reasoning_tokens must be a non-negative int or None, got {budget!r}")
    tag = CompiledTag(trigger=end, begin=end, inner=inner, end=None, spec=spec.then)
    return SwitchProgram((end,), (tag,), 1, free_eos=inner is None and budget is None, reasoning=(start, end),
                         budget=budget), warnings


def _structural(backend: GrammarBackend, tokenizer: Tokenizer, spec: StructuralTag,
                inside: str | None) -> tuple[SwitchProgram, tuple[str, ...]]:
    if not spec.triggers or not spec.tags:
        raise GrammarError("StructuralTag: needs at least one trigger and one tag")
    if spec.at_most is not None and (not isinstance(spec.at_most, int) or spec.at_most < 1):
        raise GrammarError(f"StructuralTag.at_most must be a positive int or None, got {spec.at_most!r}")
    texts = list(spec.triggers)
    triggers = [marker_ids(tokenizer, t, f"StructuralTag trigger {t!r}") for t in texts]
    for i, a in enumerate(texts):
        for j, b in enumerate(texts):
            if i != j and (a in b or _contains(triggers[j], triggers[i])):
                raise GrammarError(f"StructuralTag: triggers {a!r} and {b!r} overlap (one holds the other); "
                                   "the switch would be ambiguous")
    tags: list[CompiledTag] = []
    warnings: list[str] = []
    used: set[int] = set()
    for n, tag in enumerate(spec.tags):
        what = f"StructuralTag tag {n} ({tag.begin!r})"
        hits = [i for i, t in enumerate(texts) if tag.begin.startswith(t)]
        if len(hits) != 1:
            raise GrammarError(f"{what}: begin must start with exactly one trigger of {texts}")
        i = hits[0]
        used.add(i)
        rest = tag.begin[len(texts[i]):]
        begin = triggers[i] + (marker_ids(tokenizer, rest, f"{what} begin") if rest else ())
        end = marker_ids(tokenizer, tag.end, f"{what} end")
        if is_switch(tag.spec):
            raise GrammarError(f"{what}: a tag's spec cannot itself switch (nested Reasoning or StructuralTag)")
        inner = _compile_inner(backend, tokenizer, tag.spec, what)
        warnings.extend(inner.warnings)
        tags.append(CompiledTag(triggers[i], begin, inner, end, tag.spec))
    for a in range(len(tags)):
        for b in range(len(tags)):
            if a != b and tags[b].begin[:len(tags[a].begin)] == tags[a].begin:
                raise GrammarError(f"StructuralTag: the begin of tag {a} is a prefix of tag {b}'s; "
                                   "after it the grammar could not tell them apart")
    unused = [texts[i] for i in range(len(texts)) if i not in used]
    if unused:
        raise GrammarError(f"StructuralTag: triggers {unused} start no tag")
    return SwitchProgram(tuple(triggers), tuple(tags), spec.at_most, free_eos=True), tuple(warnings)


def token_bytes(backend: GrammarBackend, tokenizer: Tokenizer) -> tuple[bytes, ...]:
    """The bytes of each tokenizer id, as the backend's own tokenizer view has them."""
    held = getattr(backend, "token_bytes", None)
    if held is None:
        raise GrammarError(f"backend {backend.name!r} cannot say its tokens' bytes: switching grammars need them")
    return tuple(held)[: tokenizer.vocab_size]


def _scan(backend: GrammarBackend, tokenizer: Tokenizer, program: SwitchProgram,
          spec: Reasoning | StructuralTag) -> TriggerScan:
    texts = [spec.end] if isinstance(spec, Reasoning) else list(spec.triggers)
    scan = build_scan([t.encode() for t in texts], program.triggers, token_bytes(backend, tokenizer), tokenizer,
                      backend.vocab_size)
    missing = [tail for tail in scan.rows if not scan.continuation(tail, 0)]
    if program.budget is not None and missing:
        raise GrammarError(f"Reasoning: the end marker {texts[0]!r} cannot be forced after free text ending in "
                           f"{missing[0]!r} (max_reasoning_tokens needs it)")
    return scan


def _compile_inner(backend: GrammarBackend, tokenizer: Tokenizer, spec: GrammarSpec, what: str) -> CompiledGrammar:
    try:
        return backend.compile(spec)
    except GrammarError as exc:
        raise GrammarError(f"{what}: {exc}") from exc


def _contains(hay: tuple[TokenId, ...], needle: tuple[TokenId, ...]) -> bool:
    n = len(needle)
    return any(hay[i:i + n] == needle for i in range(len(hay) - n + 1))


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


# --- the matcher -----------------------------------------------------------------------------------

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
    terminated: bool = False


class SwitchMatcher:
    """The GrammarMatcher protocol for a SwitchProgram (see the module docstring)."""

    def __init__(self, program: SwitchProgram, backend: GrammarBackend, tokenizer: Tokenizer) -> None:
        self.program = program
        self._backend = backend
        self._vocab_size = backend.vocab_size
        self._tokenizer_vocab = min(tokenizer.vocab_size, backend.vocab_size)
        self._eos = frozenset(tokenizer.eos_token_ids)
        assert program.scan is not None, "compile_switch sets the trigger scan"
        self._scan = program.scan
        self._states: list[_State] = [self._initial()]
        self._ids: list[TokenId] = []               # the accepted tokens (segments())
        self._scratch = bm.allocate_bitmask(1, backend.vocab_size)

    # --- queries ---------------------------------------------------------------------------------

    @property
    def num_accepted(self) -> int:
        return len(self._states) - 1

    @property
    def phase(self) -> str:
        """"free", "begin", "inner", "end" or "done" (for the stream and tests)."""
        return self._states[-1].phase

    def is_terminated(self) -> bool:
        return self._states[-1].terminated

    def is_accepting(self) -> bool:
        s = self._states[-1]
        if s.terminated or s.phase == DONE:
            return True
        if s.phase == FREE:
            return self.program.free_eos
        if s.phase == INNER:
            return self._tag(s).end is None and (s.inner is None or s.inner.is_accepting())
        return False

    def is_free(self) -> bool:
        """Every tokenizer id is allowed now (a mask row here may be skipped)."""
        s = self._states[-1]
        if s.terminated:
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
        if s.terminated:
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
            if after.terminated and not before.terminated:
                runs.append(("eos", [t], None))
                continue
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

    # --- accept / validate / rollback -------------------------------------------------------------

    def validate(self, token_ids: Sequence[TokenId]) -> int:
        n = 0
        try:
            for t in token_ids:
                if not self._step(int(t)):
                    break
                n += 1
        finally:
            self._pop(n)
        return n

    def accept(self, token_ids: Sequence[TokenId]) -> bool:
        ids = [int(t) for t in token_ids]
        if self.validate(ids) != len(ids):
            return False
        for t in ids:
            if not self._step(t):              # validated just before: a refusal is a bug
                raise RuntimeError(f"switch matcher refused token {t} that it had validated")
        return True

    def rollback(self, n: int) -> None:
        if n < 0 or n > self.num_accepted:
            raise ValueError(f"cannot roll back {n} tokens: {self.num_accepted} accepted and not rolled back")
        self._pop(n)

    def reset(self) -> None:
        self._states = [self._initial()]
        self._ids = []

    # --- masks ------------------------------------------------------------------------------------

    def fill_mask(self, bitmask: Any, row: int = 0) -> bool:
        bm.check_bitmask(bitmask, row, self._vocab_size)
        return self._fill(bitmask, row, write_free=True)

    def fill_masks(self, bitmask: Any, start_row: int, drafts: Sequence[TokenId],
                   skip: Container[int] = (), free: Any = None) -> int:
        """As the protocol says: free rows are reported in `free` and left unwritten."""
        bm.check_bitmask(bitmask, start_row + len(drafts), self._vocab_size)
        advanced = 0
        try:
            while True:
                if advanced not in skip:
                    row = start_row + advanced
                    was_free = self._fill(bitmask, row, write_free=free is None)
                    if free is not None:
                        free[row] = was_free
                if advanced == len(drafts) or not self._step(int(drafts[advanced])):
                    break
                advanced += 1
        finally:
            self._pop(advanced)
        return 1 + advanced

    def forced_tokens(self) -> list[TokenId]:
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
        if s.terminated or not 0 <= t < self._tokenizer_vocab:
            return False
        eos = t in self._eos
        if s.phase == DONE:
            return eos and self._push(replace(s, terminated=True))
        if s.phase == FREE:
            if eos:
                return self.program.free_eos and self._push(replace(s, terminated=True))
            if self._over_budget(s) and t != self._budget_next(s):
                return False
            state = self._free_step(s, t)
            return state is not None and self._push(state)
        if s.phase == BEGIN:
            tags = tuple(i for i in s.tags if self.program.tags[i].begin[s.pos] == t)
            if not tags or eos:
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
        return self._inner_step(s, t, eos)

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

    def _inner_step(self, s: _State, t: TokenId, eos: bool) -> bool:
        tag = self._tag(s)
        accepting = s.inner is None or s.inner.is_accepting()
        if tag.end is not None and accepting and t == tag.end[0]:
            # The end marker wins over the spec when both could take t: decided by state alone,
            # so mask and accept agree.
            if len(tag.end) == 1:
                return self._step_end_done(s)
            return self._push(_State(END, tags=s.tags, pos=1, count=s.count))
        if eos:
            return tag.end is None and accepting and self._push(replace(s, terminated=True))
        if s.inner is None:
            return self._push(s)
        if not s.inner.accept([t]):
            return False
        return self._push(replace(s, depth=s.inner.num_accepted))

    def _step_end_done(self, s: _State) -> bool:
        done = self.program.at_most is not None and s.count >= self.program.at_most
        return self._push(_State(DONE if done else FREE, count=s.count))

    def _fill(self, bitmask: torch.Tensor, row: int, *, write_free: bool) -> bool:
        """Write row for the current state (free rows only when write_free); returns freedom."""
        s = self._states[-1]
        if self.is_free():
            if write_free:
                bitmask[row].fill_(-1)
                bm.clear_ids_from(bitmask, row, self._tokenizer_vocab, self._vocab_size)
            return True
        if s.terminated:
            bm.clear_row(bitmask, row)
        elif self._over_budget(s):
            bm.set_only(bitmask, row, [self._budget_next(s)])
        elif s.phase == FREE:                     # free text, but a trigger may not end mid-token
            bitmask[row].copy_(self._scan.rows[s.tail])
            self._set_eos(bitmask, row, self.program.free_eos)
        elif s.phase == DONE:
            bm.set_only(bitmask, row, sorted(t for t in self._eos if t < self._tokenizer_vocab))
        elif s.phase == BEGIN:
            bm.set_only(bitmask, row, sorted({self.program.tags[i].begin[s.pos] for i in s.tags}))
        elif s.phase == END:
            bm.set_only(bitmask, row, [self._end(s)[s.pos]])
        else:
            self._fill_inner(s, bitmask, row)
        return False

    def _fill_inner(self, s: _State, bitmask: torch.Tensor, row: int) -> None:
        tag = self._tag(s)
        if s.inner is None:                       # free answer but not free here: cannot happen
            raise AssertionError("a free inner phase is always free")
        s.inner.fill_mask(bitmask, row)
        if tag.end is not None:
            self._set_eos(bitmask, row, False)
            if s.inner.is_accepting():
                bm.set_bit(bitmask, row, tag.end[0], True)

    def _forced_here(self) -> list[TokenId]:
        s = self._states[-1]
        if s.terminated:
            return []
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
        self._set_eos(self._scratch, 0, False)
        return [] if bool(self._scratch[0].any()) else [self._end(s)[0]]

    def _set_eos(self, bitmask: torch.Tensor, row: int, allowed: bool) -> None:
        for eos in self._eos:
            if eos < self._tokenizer_vocab:
                bm.set_bit(bitmask, row, eos, allowed)


class ReasoningSplitter:
    """Splits a Reasoning output's text, as it streams, into the thinking (before the end marker,
    a leading start marker dropped) and the answer; a possible partial marker at the end of a piece
    is held back. Text-level: a marker a decode dropped (a special token) is not seen."""

    def __init__(self, markers: Reasoning = Reasoning()) -> None:
        self.START, self.END = markers.start, markers.end
        self._held = ""
        self._started = False           # the leading START has been dropped or ruled out
        self.reasoning = ""
        self.done = False

    def feed(self, piece: str) -> tuple[str, str]:
        """(thinking to send now, answer text that follows the end marker)."""
        self._held += piece
        if not self._started:
            if len(self._held) < len(self.START) and self.START.startswith(self._held):
                return "", ""
            if self._held.startswith(self.START):
                self._held = self._held[len(self.START):]
            self._started = True
        at = self._held.find(self.END)
        if at >= 0:
            thought, answer = self._held[:at], self._held[at + len(self.END):]
            self._held, self.done = "", True
            self.reasoning += thought
            return thought, answer
        keep = next((k for k in range(min(len(self._held), len(self.END) - 1), 0, -1)
                     if self._held.endswith(self.END[:k])), 0)
        thought, self._held = self._held[:len(self._held) - keep], self._held[len(self._held) - keep:]
        self.reasoning += thought
        return thought, ""

    def finish(self) -> str:
        """The output ended while thinking: what was held back is thinking too."""
        rest, self._held, self.done = self._held, "", True
        self.reasoning += rest
        return rest


class ReasoningStream:
    """The engine's split of a Reasoning output into thinking and answer, where the grammar switched:
    the first place the output's text (special tokens kept) holds the end marker, which the grammar
    makes end on a token boundary (grammars/triggers.py); then applied to the delivered text. A
    leading start marker is dropped from the thinking, the end marker from both; text that may
    begin the end marker is held back."""

    def __init__(self, tokenizer: Tokenizer, start: str, end: str) -> None:
        self._tok = tokenizer
        self._start = start
        self._end = end
        self._ids: list[TokenId] = []
        self._text = ""                  # everything delivered so far
        self._thought_at = 0             # characters of _text handed out as thinking (or skipped)
        self._switch: tuple[int, int] | None = None   # (end marker's first char, first char after it)
        self._answer_at = 0

    @property
    def switched(self) -> bool:
        return self._switch is not None

    def feed(self, tokens: Sequence[TokenId], text: str, final: bool = False) -> tuple[str, str]:
        """(thinking, answer) text to deliver for these tokens and their text."""
        first_new = len(self._ids)
        self._ids.extend(int(t) for t in tokens)
        self._text += text
        if self._switch is None:
            self._find_switch(first_new)
        if self._switch is not None:
            upto, answer_from = self._switch
        else:
            upto = len(self._text) - (0 if final else self._partial())
            answer_from = None
        if self._thought_at == 0 and not final and self._start.startswith(self._text[:len(self._start)]) \
                and len(self._text) < len(self._start):
            return "", ""                # may still become the start marker
        if self._thought_at == 0 and self._text.startswith(self._start):
            self._thought_at = len(self._start)
        upto = min(upto, len(self._text))
        thought = self._text[self._thought_at:upto] if upto > self._thought_at else ""
        self._thought_at = max(self._thought_at, upto)
        answer = ""
        if answer_from is not None:
            start = max(answer_from, self._answer_at)
            answer = self._text[start:]
            self._answer_at = max(start, len(self._text))
        return thought, answer

    def _find_switch(self, first_new: int) -> None:
        # Each token holds at least one byte, so a marker ending in the new tokens began at most
        # len(marker) tokens before them.
        lo = max(0, first_new - len(self._end.encode()))
        for m in range(max(first_new, 1), len(self._ids) + 1):
            if self._end in self._tok.decode(self._ids[lo:m]):
                # (A native grammar may switch mid-token: the answer starts right after the marker.)
                at = self._tok.decode(self._ids[:m]).find(self._end)
                self._switch = (at, at + len(self._end))
                return

    def _partial(self) -> int:
        """Characters at the end of the text that could begin the end marker."""
        tail = self._tok.decode(self._ids[-len(self._end.encode()):]) if self._ids else ""
        return next((k for k in range(min(len(tail), len(self._end) - 1), 0, -1)
                     if tail.endswith(self._end[:k])), 0)
