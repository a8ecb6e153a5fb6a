"""The pure combining rules (combine_drafts, consistent_prefix, after_forced) and the Drafter protocol."""
from __future__ import annotations

from collections.abc import Sequence

import pytest

from interlock.drafters.base import Drafter, Tracked
from interlock.drafters.combine import after_forced, combine_drafts, consistent_prefix
from interlock.drafters.forced import ForcedDrafter
from interlock.drafters.model import ModelDrafter
from interlock.drafters.ngram import NGramDrafter
from interlock.drafters.suffix import SuffixDrafter
from interlock.protocol.speculative import DraftRequest, NGramConfig, SuffixConfig


def test_combine_takes_the_longest_cut_to_k() -> None:
    assert combine_drafts([[1], [2, 3, 4], [5, 6]], 5) == [2, 3, 4]
    assert combine_drafts([[1], [2, 3, 4], [5, 6]], 2) == [2, 3]      # both reach k: first wins
    assert combine_drafts([[5, 6], [2, 3, 4]], 2) == [5, 6]
    assert combine_drafts([(7, 8), [9, 9]], 3) == [7, 8]               # tie: earlier member
    assert combine_drafts([[], []], 3) == []
    assert combine_drafts([], 3) == []
    assert combine_drafts([[1, 2]], 0) == []
    with pytest.raises(ValueError):
        combine_drafts([[1]], -1)


def ngram(seq: list[int]) -> NGramDrafter:
    d = NGramDrafter(NGramConfig(max_matching_ngram_size=2), max_draft_len=4)
    d.add("r", seq)
    return d


def after(d: NGramDrafter, forced: list[int], k: int) -> list[int]:
    return after_forced(forced, k, lambda n, head: d.lookup("r", n, after=head))


def test_after_forced_continues_past_the_forced_tokens() -> None:
    d = ngram([1, 2, 3, 4, 9])
    assert after(d, [1, 2], 4) == [1, 2, 3, 4]        # (1, 2) was followed by 3 4
    assert after(d, [1, 2], 2) == [1, 2]
    assert after(d, [1, 2, 3, 4, 5], 3) == [1, 2, 3]  # forced alone fill k
    assert after(d, [], 4) == d.lookup("r", 4)
    assert after(d, [6], 4) == [6]                    # nothing followed 6
    assert d.lookup("r", 4) == []                     # forced tokens not indexed
    # The Drafter protocol answer of the n-gram drafter is exactly that.
    assert d.propose([DraftRequest("r", (), (1, 2)), DraftRequest("r", ())], 4) == [[1, 2, 3, 4], []]


def test_consistent_prefix_cuts_at_a_disagreement_with_the_forced_tokens_or_the_vocabulary() -> None:
    assert consistent_prefix([5, 6, 7], (5, 6), 10) == [5, 6, 7]
    assert consistent_prefix([5, 8, 7], (5, 6), 10) == [5]            # 8 is certain to be rejected
    assert consistent_prefix([4, 6], (5,), 10) == []
    assert consistent_prefix([1, 12, 2], (), 10) == [1]               # 12 is no token
    assert consistent_prefix([1, -1], (), 10) == [1]


def test_every_built_in_lookup_drafter_is_a_tracked_drafter() -> None:
    for d in (ngram([1]), SuffixDrafter(SuffixConfig(), 4), ForcedDrafter()):
        assert isinstance(d, Drafter) and isinstance(d, Tracked)
    assert ForcedDrafter().propose([DraftRequest("r", (), (3, 4, 5))], 2) == [(3, 4)]
    # The draft model drafts in rounds (drafters/model.py): Tracked, but no one-call propose.
    assert isinstance(ModelDrafter.__new__(ModelDrafter), Tracked)
    assert not isinstance(ModelDrafter.__new__(ModelDrafter), Drafter)


def test_a_user_drafter_satisfies_the_protocol() -> None:
    class Repeat:
        def propose(self, requests: Sequence[DraftRequest], k: int) -> list[list[int]]:
            return [[r.tokens[-1]] * k for r in requests]

    assert isinstance(Repeat(), Drafter)
    assert not isinstance(object(), Drafter)
