"""Applying operations to a matcher under test and checking it against a fresh replay.

The oracle is simple on purpose: a new matcher that accepts the same prefix in one call, with no
rollback ever, must agree with the matcher under test on the mask (bit for bit), on is_accepting
and is_terminated, and on the accepted depth. `Harness` is the only code that performs and checks
operations; the state machine and `run_operations` both drive it.
"""
from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from typing import Any

from hypothesis import note
from hypothesis.errors import InvalidArgument

from interlock.grammars.bitmask import allowed_ids, clear_row
from interlock.protocol.types import TokenId
from interlock.testing.case import GrammarCase, Tokens
from interlock.testing.operations import Accept, FillMasks, OfferRefused, Op, Rollback, RollbackTooFar

ROWS = 8                    # scratch mask rows: row 0 for checks, rows 1.. for fill_masks
SENTINEL = 0x5A5A5A5A       # what unwritten (free) fill_masks rows must still hold
MAX_SHOWN = 8               # differing ids listed in a failure message


class MatcherMismatch(AssertionError):
    """The matcher under test broke the contract.

    what: the broken promise; accepted: the prefix the matcher should hold; history: every
    operation applied to it, in order (after shrinking: the minimal failing run).
    """

    def __init__(self, what: str, accepted: Tokens, history: Sequence[Op] = ()) -> None:
        steps = "".join(f"\n  {op!r}" for op in history)
        super().__init__(f"{what}; accepted so far: {accepted!r}" + (f"; operations:{steps}" if steps else ""))
        self.what = what
        self.accepted = accepted
        self.history = tuple(history)


class Harness:
    """One matcher under test, the prefix it should hold, and a scratch bitmask.

    lenient_refusals: accept may take a token its mask refuses (llguidance: the mask keeps to the
    canonical tokenization of forced text, accept does not; grammars/LENIENCY.md). The token then
    counts as accepted and every other check still applies. Off by default: it is a real bug for a
    drafter, whose tokens the grammar would take although the masked target could not emit them.
    """

    def __init__(self, case: GrammarCase, *, lenient_refusals: bool = False) -> None:
        self.case = case
        self.lenient_refusals = lenient_refusals
        self.matcher = case.matcher()
        self.accepted: list[TokenId] = []
        self.history: list[Op] = []
        self.mask = case.backend.allocate_bitmask(ROWS)

    def fail(self, what: str) -> MatcherMismatch:
        return MatcherMismatch(what, self.case.tokens(self.accepted), self.history)

    def apply(self, op: Op) -> None:
        """Perform op on the matcher and check what the op itself promises."""
        _note(repr(op))
        self.history.append(op)
        if isinstance(op, Accept):
            if not self.matcher.accept([op.token]):
                raise self.fail(f"the mask allowed {op!r} but accept refused it")
            self.accepted.append(op.token)
        elif isinstance(op, OfferRefused):
            self._offer_refused(op)
        elif isinstance(op, Rollback):
            self.matcher.rollback(op.n)
            del self.accepted[len(self.accepted) - op.n:]
        elif isinstance(op, RollbackTooFar):
            self._rollback_too_far()
        elif isinstance(op, FillMasks):
            self._fill_masks(op)
        else:
            raise TypeError(f"not an operation: {op!r}")

    def check(self) -> None:
        """The matcher agrees with a fresh matcher replaying the accepted prefix."""
        fresh = self.case.replay(self.accepted)
        if fresh is None:
            raise self.fail("a fresh matcher refuses the accepted prefix")
        if self.matcher.num_accepted != len(self.accepted):
            raise self.fail(f"num_accepted is {self.matcher.num_accepted}, expected {len(self.accepted)}")
        mine_free = self.matcher.fill_mask(self.mask, 0)
        ref_free = fresh.fill_mask(self.mask, 1)
        self._same_rows(0, 1, "the mask differs from a fresh replay")
        if isinstance(mine_free, bool) and isinstance(ref_free, bool) and mine_free != ref_free:
            raise self.fail(f"fill_mask says free={mine_free}, a fresh replay says {ref_free}")
        if mine_free is True:
            self._all_ids(0, "fill_mask reported a free state")
        for name in ("is_terminated", "is_accepting"):
            mine, ref = getattr(self.matcher, name)(), getattr(fresh, name)()
            if mine != ref:
                raise self.fail(f"{name}() is {mine}, a fresh replay says {ref}")

    # --- one method per op with more than a line to check ---------------------------------------

    def _offer_refused(self, op: OfferRefused) -> None:
        self.matcher.fill_mask(self.mask, 1)
        if self.matcher.accept([op.token]):
            self.accepted.append(op.token)       # keep the history true (and the failure report)
            if self.lenient_refusals:
                _note("  (accept took it: lenient_refusals)")
                return
            raise self.fail(f"accept took {op!r}, which the mask refuses")
        self.matcher.fill_mask(self.mask, 0)
        self._same_rows(0, 1, f"the mask changed after a refused {op!r}")

    def _rollback_too_far(self) -> None:
        try:
            self.matcher.rollback(len(self.accepted) + 1)
        except ValueError:
            return
        raise self.fail("rollback past the accepted history did not raise ValueError")

    def _fill_masks(self, op: FillMasks) -> None:
        drafts = list(op.drafts)
        fresh = self.case.replay(self.accepted)
        if fresh is None:
            raise self.fail("a fresh matcher refuses the accepted prefix")
        expected = 1 + fresh.validate(drafts)
        skip = set(op.skip)
        self._prepare_rows(drafts, expected, skip)
        free: list[bool | None] | None = None
        if _takes_free(self.matcher):
            # Rows reported free must be left unwritten: a sentinel shows any write.
            free = [None] * ROWS
            for j in range(expected):
                if j not in skip:
                    self.mask[1 + j].fill_(SENTINEL)
            rows = self.matcher.fill_masks(self.mask, 1, drafts, skip=frozenset(skip), free=free)
        else:
            rows = self.matcher.fill_masks(self.mask, 1, drafts, skip=frozenset(skip))
        if rows != expected:
            raise self.fail(f"{op!r} filled {rows} rows, expected {expected} (1 + allowed drafts)")
        if self.matcher.num_accepted != len(self.accepted):
            raise self.fail(f"{op!r} changed num_accepted to {self.matcher.num_accepted}")
        for j in range(rows):
            ref_free = fresh.fill_mask(self.mask, 0)
            if free is not None and j not in skip:
                self._check_free_row(op, j, free[1 + j], ref_free)
            else:
                self._same_rows(1 + j, 0, f"{op!r}: row {j} (after drafts {drafts[:j]}) differs from a replay")
            if j < rows - 1 and not fresh.accept([drafts[j]]):
                raise self.fail(f"a fresh matcher refuses draft {j} of {op!r}, which validate allowed")

    def _check_free_row(self, op: FillMasks, j: int, reported: bool | None, ref_free: Any) -> None:
        """Row 1+j against the fresh replay's mask in row 0: free rows unwritten, others equal."""
        if reported is None:
            raise self.fail(f"{op!r}: row {j} was neither reported free nor filled")
        if not reported:
            self._same_rows(1 + j, 0, f"{op!r}: row {j} (after drafts {list(op.drafts[:j])}) differs from a replay")
            return
        if not bool((self.mask[1 + j] == SENTINEL).all()):
            raise self.fail(f"{op!r}: row {j} was reported free but written")
        if ref_free is not True:
            raise self.fail(f"{op!r}: row {j} was reported free, a fresh replay is not free there")
        self._all_ids(0, f"{op!r}: row {j} was reported free")

    def _prepare_rows(self, drafts: list[TokenId], rows: int, skip: set[int]) -> None:
        """Rows 1+j: the right mask where j is skipped (as draft-side masking leaves them), empty
        elsewhere, so that a row the matcher should fill and does not shows up as a difference."""
        replay = self.case.replay(self.accepted)
        for j in range(rows):
            if j in skip and replay is not None:
                replay.fill_mask(self.mask, 1 + j)
            else:
                clear_row(self.mask, 1 + j)
            if replay is not None and j < rows - 1 and not replay.accept([drafts[j]]):
                replay = None

    def _all_ids(self, row: int, what: str) -> None:
        """A free state allows every tokenizer id (and no padding id)."""
        V = self.case.vocab_size
        want = list(range(min(V, self.case.tokenizer.vocab_size)))
        if allowed_ids(self.mask, row, V) != want:
            raise self.fail(f"{what}, but its mask does not allow every tokenizer id")

    def _same_rows(self, mine: int, ref: int, what: str) -> None:
        V = self.case.vocab_size
        got, want = allowed_ids(self.mask, mine, V), allowed_ids(self.mask, ref, V)
        if got != want:
            extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
            raise self.fail(f"{what}: allows {self._ids(extra)} it should not, misses {self._ids(missing)}")

    def _ids(self, ids: Sequence[TokenId]) -> str:
        shown = ", ".join(f"{t} {self.case.text([t])!r}" for t in ids[:MAX_SHOWN])
        more = f" and {len(ids) - MAX_SHOWN} more" if len(ids) > MAX_SHOWN else ""
        return f"[{shown}{more}]"


def run_operations(case: GrammarCase, ops: Iterable[Op], *, lenient_refusals: bool = False) -> Harness:
    """Apply ops to a new matcher from case, checking after each; raises MatcherMismatch."""
    harness = Harness(case, lenient_refusals=lenient_refusals)
    harness.check()
    for op in ops:
        harness.apply(op)
        harness.check()
    return harness


def _note(text: str) -> None:
    """hypothesis.note inside a test (printed with the final failing example); nothing outside."""
    try:
        note(text)
    except InvalidArgument:          # run_operations called outside @given / a state machine
        pass


def _takes_free(matcher: Any) -> bool:
    """Does matcher.fill_masks report free rows (the `free` buffer of the protocol)?"""
    try:
        return "free" in inspect.signature(matcher.fill_masks).parameters
    except (TypeError, ValueError):
        return False
