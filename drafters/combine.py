"""Combining drafters: per request and step, propose the longest useful draft among the members.

Grammar-forced tokens (the matcher's jump-forward tokens) are drafts for free: the grammar allows
nothing else, so the target accepts them whenever it would not stop there. They come first, and an
n-gram lookup can continue past them.
"""
from __future__ import annotations

from collections.abc import Sequence

from interlock.drafters.ngram import NGramDrafter
from interlock.protocol.types import RequestId, TokenId


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


def forced_then_ngram(
    forced: Sequence[TokenId], ngram: NGramDrafter, request_id: RequestId, k: int
) -> list[TokenId]:
    """The forced tokens (up to k), then the n-gram continuation of sequence + forced for the rest.

    A plain n-gram draft is no alternative when forced tokens exist: its first token would have to
    equal forced[0] to be accepted, and the continuation past the forced tokens covers that case.
    """
    head = list(forced[:k])
    if len(head) == k:
        return head
    return head + ngram.propose(request_id, k - len(head), after=head)
