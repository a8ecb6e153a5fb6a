"""combine_drafts, forced_then_ngram and the Drafter Protocol."""
from __future__ import annotations

from collections.abc import Sequence

import pytest

from interlock.drafters.base import Drafter
from interlock.drafters.combine import combine_drafts, forced_then_ngram
from interlock.drafters.ngram import NGramDrafter
from interlock.protocol.messages import RequestSnapshot
from interlock.protocol.speculative import NGramConfig


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
    d.add_request("r", seq)
    return d


def test_forced_then_ngram_continues_past_the_forced_tokens() -> None:
    d = ngram([1, 2, 3, 4, 9])
    assert forced_then_ngram([1, 2], d, "r", 4) == [1, 2, 3, 4]       # (1, 2) was followed by 3 4
    assert forced_then_ngram([1, 2], d, "r", 2) == [1, 2]
    assert forced_then_ngram([1, 2, 3, 4, 5], d, "r", 3) == [1, 2, 3]  # forced alone fill k
    assert forced_then_ngram([], d, "r", 4) == d.propose("r", 4)
    assert forced_then_ngram([6], d, "r", 4) == [6]                   # nothing followed 6
    assert d.propose("r", 4) == []                                     # forced tokens not indexed


def test_a_user_drafter_satisfies_the_protocol() -> None:
    class Repeat:
        def propose(self, snapshots: Sequence[RequestSnapshot], k: int) -> list[list[int]]:
            return [[s.chunk[-1]] * k for s in snapshots]

    assert isinstance(Repeat(), Drafter)
    assert not isinstance(object(), Drafter)
