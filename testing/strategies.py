"""Hypothesis strategies over a `GrammarCase`: sequences it allows, sequences it refuses, and
interleavings of matcher operations.

Every strategy walks the grammar's real mask (a fresh matcher per example, filled at each step),
so what it draws is what a constrained decoder could produce with this tokenizer — not text that
re-tokenizes differently. Length and the kinds of tokens picked are knobs (`TokenMix`).
"""
from __future__ import annotations

from hypothesis import reject
from hypothesis import strategies as st

from interlock.protocol.types import TokenId
from interlock.testing.case import GrammarCase, Refused, Tokens
from interlock.testing.choice import Draw, TokenMix, draw_token
from interlock.testing.harness import MatcherMismatch
from interlock.testing.operations import (OP_KINDS, Accept, Op, Rollback, RollbackTooFar, draw_accept, draw_fill_masks,
                                          draw_offer_refused, draw_rollback)

DEFAULT_MIX = TokenMix()


def allowed_sequences(case: GrammarCase, *, min_size: int = 0, max_size: int = 16,
                      mix: TokenMix = DEFAULT_MIX) -> st.SearchStrategy[Tokens]:
    """Token sequences the grammar allows, each token drawn from the mask after the ones before.

    Lengths lie in [min_size, max_size], except that a walk stops early where the grammar allows
    nothing more (after EOS); EOS is only picked once min_size tokens are there (or when it is the
    only token left). Sequences need not be complete sentences: check `is_accepting` for that.
    """
    _check_sizes(min_size, max_size)

    @st.composite
    def walk(draw: Draw) -> Tokens:
        return case.tokens(_walk(draw, case, draw(st.integers(min_size, max_size), label="length"), mix,
                                 min_size))

    return walk()


def refused_sequences(case: GrammarCase, *, max_prefix: int = 8, include_padding: bool = True,
                      mix: TokenMix = DEFAULT_MIX) -> st.SearchStrategy[Refused]:
    """An allowed prefix (as `allowed_sequences`) plus one token the mask refuses right after it.

    The refused token is any id in [0, V) outside the mask, or in [0, tokenizer size) when
    include_padding is False. Examples where the grammar refuses nothing are rejected.
    """
    _check_sizes(0, max_prefix)

    @st.composite
    def refused(draw: Draw) -> Refused:
        prefix = _walk(draw, case, draw(st.integers(0, max_prefix), label="prefix length"), mix, 0)
        matcher = case.replay(prefix)
        if matcher is None:
            raise MatcherMismatch("a fresh matcher refuses the walked prefix", case.tokens(prefix))
        allowed = set(case.allowed(matcher))
        end = case.vocab_size if include_padding else min(case.vocab_size, case.tokenizer.vocab_size)
        if len(allowed) >= end:
            reject()                       # the grammar refuses nothing here
        token = draw(st.integers(0, end - 1 - len(allowed)), label="refused index")
        token = _nth_missing(sorted(allowed), token)
        return Refused(case.tokens(prefix), token, case.text([token]))

    return refused()


def operations(case: GrammarCase, *, max_ops: int = 20, mix: TokenMix = DEFAULT_MIX) -> st.SearchStrategy[list[Op]]:
    """Interleavings of accept / offer-refused / rollback / fill_masks operations, each valid at
    its point (tokens drawn from the mask, rollbacks within the accepted depth).

    The state between draws comes from replaying the accepted prefix on a fresh matcher, never
    from a rollback, so the strategy itself trusts nothing it is meant to test. Run them with
    `run_operations(case, ops)`.
    """
    _check_sizes(0, max_ops)

    @st.composite
    def interleaving(draw: Draw) -> list[Op]:
        ops: list[Op] = []
        accepted: list[TokenId] = []
        for _ in range(draw(st.integers(0, max_ops), label="operations")):
            op = _draw_op(draw, case, accepted, mix)
            if op is None:
                continue
            ops.append(op)
            _track(op, accepted)
        return ops

    return interleaving()


def _draw_op(draw: Draw, case: GrammarCase, accepted: list[TokenId], mix: TokenMix) -> Op | None:
    kind = draw(st.sampled_from(OP_KINDS), label="operation")
    if kind == "rollback":
        return draw_rollback(draw, len(accepted))
    if kind == "rollback_too_far":
        return RollbackTooFar()
    if kind == "fill_masks":
        return draw_fill_masks(draw, case, accepted, mix)
    matcher = case.replay(accepted)
    if matcher is None:
        raise MatcherMismatch("a fresh matcher refuses the accepted prefix", case.tokens(accepted))
    if kind == "accept":
        return draw_accept(draw, case, matcher, mix)
    return draw_offer_refused(draw, case, matcher)


def _track(op: Op, accepted: list[TokenId]) -> None:
    """Update the expected prefix the way a correct matcher's history changes."""
    if isinstance(op, Accept):
        accepted.append(op.token)
    elif isinstance(op, Rollback):
        del accepted[len(accepted) - op.n:]


def _walk(draw: Draw, case: GrammarCase, length: int, mix: TokenMix, min_size: int) -> list[TokenId]:
    matcher = case.matcher()
    ids: list[TokenId] = []
    while len(ids) < length:
        token = draw_token(draw, case, matcher, mix, allow_eos=len(ids) + 1 >= min_size)
        if token is None:
            break
        if not matcher.accept([token]):
            raise MatcherMismatch(f"the mask allowed {token} {case.text([token])!r} but accept refused it",
                                  case.tokens(ids))
        ids.append(token)
    return ids


def _nth_missing(present: list[int], n: int) -> int:
    """The n-th (0-based) non-negative int not in the sorted list present."""
    for p in present:
        if p > n:
            break
        n += 1                               # every present id at or below the answer shifts it
    return n


def _check_sizes(low: int, high: int) -> None:
    if low < 0 or high < low:
        raise ValueError(f"sizes must satisfy 0 <= min <= max, got {low}, {high}")
