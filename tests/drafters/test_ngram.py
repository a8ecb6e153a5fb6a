"""NGramDrafter: each TensorRT-LLM option on hand-made sequences, incremental updates, freeing."""
from __future__ import annotations

import pytest

from interlock.drafters import ngram as ngram_mod
from interlock.drafters.ngram import NGramDrafter
from interlock.protocol.errors import RequestError
from interlock.protocol.speculative import NGramConfig


def drafter(n: int = 2, d: int = 3, *, keep_all: bool = True, oldest: bool = True,
            public: bool = False) -> NGramDrafter:
    cfg = NGramConfig(max_matching_ngram_size=n, is_keep_all=keep_all, is_use_oldest=oldest,
                      is_public_pool=public)
    return NGramDrafter(cfg, max_draft_len=d)


# (9, 1) occurs three times before the suffix, followed by 5 9 1 / 6 9 1 / 7 8 8.
THREE_CONTINUATIONS = [9, 1, 5, 9, 1, 6, 9, 1, 7, 8, 8, 8, 9, 1]


@pytest.mark.parametrize("keep_all", [True, False])
def test_oldest_vs_newest(keep_all: bool) -> None:
    old, new = drafter(keep_all=keep_all, oldest=True), drafter(keep_all=keep_all, oldest=False)
    old.add("r", THREE_CONTINUATIONS)
    new.add("r", THREE_CONTINUATIONS)
    assert old.lookup("r", 3) == [5, 9, 1]
    assert new.lookup("r", 3) == [7, 8, 8]


def test_keep_all_stores_every_occurrence_single_stores_one_per_key() -> None:
    all_, one = drafter(keep_all=True), drafter(keep_all=False)
    all_.add("r", THREE_CONTINUATIONS)
    one.add("r", THREE_CONTINUATIONS)
    assert all_.stats().keys == one.stats().keys
    assert one.stats().occurrences == one.stats().keys
    # (9,), (1,), (9, 1) occur 3 times, (8,) and (8, 8) twice each before the end: 3*2 + 2*2 extra.
    assert all_.stats().occurrences == one.stats().occurrences + 3 * 2 + 2 * 2


def test_keep_all_newest_skips_a_continuation_that_runs_into_the_end() -> None:
    # (9, 1) at e=2 is followed by 5 6 7; the newest, at e=8, only by the suffix's own 9 1.
    seq = [9, 1, 5, 6, 7, 0, 9, 1, 9, 1]
    keep, single = drafter(keep_all=True, oldest=False), drafter(keep_all=False, oldest=False)
    keep.add("r", seq)
    single.add("r", seq)
    assert single.lookup("r", 3) == [9, 1]          # the one kept occurrence, cut at the end
    assert keep.lookup("r", 3) == [5, 6, 7]         # the newest with k tokens
    assert keep.lookup("r", 2) == [9, 1]            # at k=2 the newest is full length


def test_longest_match_first_then_shorter() -> None:
    # (1, 2, 3) was followed by 4 0 2; (2, 3) most recently by 5 1 2.
    seq = [1, 2, 3, 4, 0, 2, 3, 5, 1, 2, 3]
    long_, short = drafter(n=3, oldest=False), drafter(n=2, oldest=False)
    long_.add("r", seq)
    short.add("r", seq)
    assert long_.lookup("r", 3) == [4, 0, 2]
    assert short.lookup("r", 3) == [5, 1, 2]
    # No earlier (x, 6) or (6,): falls back to nothing; (6, 3)-less tail 3 -> 1-gram lookup works.
    only_unigram = drafter(n=3)
    only_unigram.add("r", [3, 8, 9, 7, 3])
    assert only_unigram.lookup("r", 3) == [8, 9, 7]


def test_public_vs_private_pool_across_requests() -> None:
    for public in (False, True):
        d = drafter(public=public)
        d.add("a", [1, 2, 3, 4])
        d.add("b", [7, 1, 2])
        assert d.lookup("b", 2) == ([3, 4] if public else [])
        assert d.lookup("a", 2) == []           # a's own suffix (3, 4) never continued anywhere
        d.remove("a")
        # A public pool keeps what a taught it; a private one never had it.
        assert d.lookup("b", 2) == ([3, 4] if public else [])
        assert d.stats().pools == 1


def test_extend_learns_from_generated_tokens() -> None:
    d = drafter()
    d.add("r", [5, 6, 7])
    assert d.lookup("r", 3) == []
    d.commit("r", [8, 5, 6])
    assert d.lookup("r", 3) == [7, 8, 5]
    d.commit("r", [7])
    assert d.lookup("r", 3) == [8, 5, 6]


def test_extend_is_incremental(monkeypatch: pytest.MonkeyPatch) -> None:
    d = drafter(n=3)
    d.add("r", list(range(500)))
    calls: list[int] = []
    real_add = ngram_mod._Pool.add

    def counting_add(self, key, occ):  # type: ignore[no-untyped-def]
        calls.append(len(key))
        real_add(self, key, occ)

    monkeypatch.setattr(ngram_mod._Pool, "add", counting_add)
    d.commit("r", [1, 2])
    # One key per n-gram size ending before each new token: no rescan of the 500-token prompt.
    assert sorted(calls) == [1, 1, 2, 2, 3, 3]


def test_continuation_read_live_grows_with_the_sequence() -> None:
    d = drafter(n=1, d=4, keep_all=False, oldest=True)
    d.add("r", [4, 2, 4])
    assert d.lookup("r", 4) == [2, 4]               # runs into the current end
    d.commit("r", [2, 4, 3])                          # suffix (3,) is new
    d.commit("r", [4])                                # back to (4,): the first occurrence's
    assert d.lookup("r", 4) == [2, 4, 2, 4]          # continuation has grown to 4 tokens


def test_k_truncation_and_bounds() -> None:
    d = drafter(d=3)
    d.add("r", THREE_CONTINUATIONS)
    assert d.lookup("r", 1) == [5]
    assert d.lookup("r", 2) == [5, 9]
    assert d.lookup("r", 0) == []
    with pytest.raises(ValueError):
        d.lookup("r", 4)
    with pytest.raises(ValueError):
        d.lookup("r", -1)
    with pytest.raises(ValueError):
        NGramDrafter(NGramConfig(), max_draft_len=0)


@pytest.mark.parametrize("prompt", [[], [7], [1, 2, 3, 4, 5]])
def test_empty_proposals(prompt: list[int]) -> None:
    d = drafter()
    d.add("r", prompt)
    assert d.lookup("r", 3) == []


def test_after_continues_past_uncommitted_tokens() -> None:
    d = drafter(n=3)
    d.add("r", [1, 2, 3, 4, 9])
    before = d.stats()
    assert d.lookup("r", 3, after=[1, 2]) == [3, 4, 9]
    assert d.lookup("r", 3) == []                    # nothing was committed or indexed
    assert d.stats() == before


def test_request_misuse_raises_typed_errors() -> None:
    d = drafter()
    d.add("r", [1, 2])
    with pytest.raises(RequestError):
        d.add("r", [3])
    with pytest.raises(RequestError):
        d.lookup("nope", 1)
    with pytest.raises(RequestError):
        d.commit("nope", [1])
    d.remove("nope")                                  # idempotent: teardown may race a failure
    d.remove("r")
    d.remove("r")
    assert d.stats().requests == 0


def test_private_pools_are_freed_over_many_requests() -> None:
    d = drafter(n=3, d=4)
    d.add("keep", [1, 2, 3])
    before = d.stats()
    for i in range(1000):
        rid = f"r{i}"
        d.add(rid, [i % 7, 1, 2, 3, i % 5, 1, 2])
        d.commit(rid, [i % 3, 1])
        assert d.lookup(rid, 4)                       # it did index something
        d.remove(rid)
    assert d.stats() == before


def test_public_pool_drops_request_sequences_but_keeps_entries() -> None:
    d = drafter(public=True)
    d.add("a", [1, 2, 3, 4])
    learnt = d.stats()
    d.remove("a")
    after = d.stats()
    assert after.requests == 0
    assert (after.pools, after.keys, after.occurrences) == (learnt.pools, learnt.keys, learnt.occurrences)
