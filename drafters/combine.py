"""Combining drafts: the pure rules the chain applies to its members' answers.

Grammar-forced tokens are the only tokens the grammar allows, so a draft that disagrees with one
is certain to be rejected there (`consistent_prefix` cuts it); a lookup drafter continues past
them (`after_forced`); among the answers, the longest one is verified (`combine_drafts`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from interlock.protocol.types import TokenId


def combine_drafts(candidates: Sequence[Sequence[TokenId]], k: int) -> list[TokenId]:
    """The longest candidate cut to k tokens; on a tie the earliest candidate (order = priority)."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    best: Sequence[TokenId] = ()
    for cand in candidates:
        if min(len(cand), k) > len(best):
            best = cand[:k]
            if len(best) == k:
                break
    return list(best)


def consistent_prefix(draft: Sequence[TokenId], forced: Sequence[TokenId], vocab_size: int) -> list[TokenId]:
    """The longest prefix of `draft` that agrees with the forced tokens and holds only ids in
    [0, vocab_size) (a user drafter's answer is not trusted to)."""
    out: list[TokenId] = []
    for j, token in enumerate(draft):
        t = int(token)
        if not 0 <= t < vocab_size or (j < len(forced) and t != forced[j]):
            break
        out.append(t)
    return out


def after_forced(forced: Sequence[TokenId], k: int,
                 lookup: Callable[[int, Sequence[TokenId]], list[TokenId]]) -> list[TokenId]:
    """The forced tokens (up to k), then `lookup(k - len(head), head)`: a continuation of the
    sequence followed by them.

    A plain lookup draft is no alternative when forced tokens exist: its first token would have to
    equal forced[0] to be accepted, and the continuation past the forced tokens covers that case.
    """
    head = list(forced[:k])
    if len(head) == k:
        return head
    return head + lookup(k - len(head), head)
