"""The operations a decoding loop performs on a matcher, as data, and how to draw each one.

A speculative step accepts drafts, fills several mask rows at once, and rolls back what the
target rejected; a buggy matcher shows up only under some interleaving of these. Ops are frozen
and print as what they do (`accept 107 '{"'`), so a shrunk failing interleaving reads as a story.
The draw functions look at a matcher in the current state; `draw_fill_masks` advances a throwaway
replay, never the matcher under test.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import strategies as st

from interlock.protocol.grammar import GrammarMatcher
from interlock.protocol.types import TokenId
from interlock.testing.case import GrammarCase
from interlock.testing.choice import Draw, TokenMix, draw_token

MAX_EXTRA_DRAFTS = 3        # fill_masks drafts after the walked ones: arbitrary ids, mostly refused


@dataclass(frozen=True)
class Accept:
    """accept([token]) where the mask allows token: must succeed."""

    token: TokenId
    text: str

    def __repr__(self) -> str:
        return f"accept {self.token} {self.text!r}"


@dataclass(frozen=True)
class OfferRefused:
    """accept([token]) where the mask refuses token: must return False and change nothing."""

    token: TokenId
    text: str

    def __repr__(self) -> str:
        return f"offer refused {self.token} {self.text!r}"


@dataclass(frozen=True)
class Rollback:
    """rollback(n) with n <= accepted depth."""

    n: int

    def __repr__(self) -> str:
        return f"rollback {self.n}"


@dataclass(frozen=True)
class RollbackTooFar:
    """rollback(depth + 1): must raise ValueError and change nothing."""

    def __repr__(self) -> str:
        return "rollback past the history"


@dataclass(frozen=True)
class FillMasks:
    """fill_masks(bitmask, 1, drafts, skip): row j must be the mask after drafts[:j]; state unchanged.

    skip: offsets whose rows already hold their mask (draft-side masking filled them while the
    draft model drafted); the matcher must leave those rows alone and still fill every other row.
    """

    drafts: tuple[TokenId, ...]
    text: str
    skip: tuple[int, ...] = ()

    def __repr__(self) -> str:
        skip = f" skip {list(self.skip)}" if self.skip else ""
        return f"fill_masks drafts {list(self.drafts)} {self.text!r}{skip}"


Op = Accept | OfferRefused | Rollback | RollbackTooFar | FillMasks
OP_KINDS = ("accept", "fill_masks", "rollback", "offer_refused", "rollback_too_far")


def draw_accept(draw: Draw, case: GrammarCase, matcher: GrammarMatcher, mix: TokenMix) -> Accept | None:
    token = draw_token(draw, case, matcher, mix)
    return None if token is None else Accept(token, case.text([token]))


def draw_marker(draw: Draw, case: GrammarCase, matcher: GrammarMatcher) -> Accept | None:
    """Accept of a token that advances a switching grammar's marker (its `marker_hints()`), or None."""
    hints = getattr(matcher, "marker_hints", None)
    if hints is None:
        return None
    allowed = set(case.allowed(matcher))
    ids = [t for t in hints() if t in allowed]
    if not ids:
        return None
    token = ids[draw(st.integers(0, len(ids) - 1), label="marker token index")]
    return Accept(token, case.text([token]))


def draw_offer_refused(draw: Draw, case: GrammarCase, matcher: GrammarMatcher) -> OfferRefused | None:
    """A refused id: out of range (-1, V), the last id, or every 7th id outside the mask.

    A sparse grid keeps the list short for a 49k vocabulary while still reaching the padding
    (ids >= the tokenizer's size) and ids just next to allowed ones.
    """
    V = case.vocab_size
    allowed = set(case.allowed(matcher))
    refused = [t for t in (-1, V - 1, V, *range(0, V, 7)) if t not in allowed]
    if not refused:
        return None
    token = refused[draw(st.integers(0, len(refused) - 1), label="refused token index")]
    return OfferRefused(token, case.text([token]))


def draw_rollback(draw: Draw, depth: int) -> Rollback:
    return Rollback(draw(st.integers(0, depth), label="rollback n"))


def draw_fill_masks(draw: Draw, case: GrammarCase, accepted: Sequence[TokenId], mix: TokenMix) -> FillMasks:
    """Drafts: a short walk the grammar allows from here, then a few arbitrary ids."""
    replay = case.replay(accepted)
    walked: list[TokenId] = []
    for _ in range(draw(st.integers(0, 3), label="allowed drafts")):
        if replay is None:
            break
        token = draw_token(draw, case, replay, mix)
        if token is None or not replay.accept([token]):
            break
        walked.append(token)
    extra = draw(st.lists(st.integers(0, case.vocab_size - 1), max_size=MAX_EXTRA_DRAFTS), label="extra drafts")
    drafts = (*walked, *extra)
    # Draft-side masking fills the rows of the walked (allowed) drafts first and skips them here.
    skip = draw(st.lists(st.integers(0, len(walked)), unique=True, max_size=len(walked) + 1), label="skip rows")
    return FillMasks(drafts, case.text(drafts), tuple(sorted(skip)))
