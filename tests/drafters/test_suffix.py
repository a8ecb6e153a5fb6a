"""The suffix drafter against brute force: trie counts are substring counts, remove undoes add
exactly (no node left behind), drafts follow the most frequent continuation within the length rules,
and finished outputs reach other requests through the bounded global trie."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.drafters.suffix import SuffixConfig, SuffixDrafter, SuffixTrie
from interlock.protocol.errors import RequestError

seqs = st.lists(st.integers(0, 4), max_size=40)


def substring_counts(sequences: list[list[int]], depth: int) -> Counter:
    counts: Counter = Counter()
    for s in sequences:
        for i in range(len(s)):
            for j in range(i + 1, min(len(s), i + depth) + 1):
                counts[tuple(s[i:j])] += 1
    return counts


def all_paths(trie: SuffixTrie) -> dict[tuple[int, ...], int]:
    return trie.substrings()


@settings(max_examples=150, deadline=None)
@given(st.lists(seqs, max_size=4), st.integers(2, 6))
def test_trie_counts_every_substring_up_to_depth(sequences, depth):
    trie = SuffixTrie(depth)
    for s in sequences:
        trie.add(s)
    expected = substring_counts(sequences, depth)
    assert all_paths(trie) == dict(expected)
    assert trie.nodes == len(expected)


@settings(max_examples=150, deadline=None)
@given(st.lists(seqs, min_size=1, max_size=4), st.data())
def test_remove_undoes_add_exactly(sequences, data):
    trie = SuffixTrie(5)
    for s in sequences:
        trie.add(s)
    gone = data.draw(st.sets(st.integers(0, len(sequences) - 1)))
    for i in sorted(gone, reverse=True):
        trie.remove(sequences[i])
    kept = [s for i, s in enumerate(sequences) if i not in gone]
    assert all_paths(trie) == dict(substring_counts(kept, 5))
    for s in kept:
        trie.remove(s)
    assert trie.nodes == 0 and trie.substrings() == {}


def test_draft_follows_the_most_frequent_continuation():
    d = SuffixDrafter(SuffixConfig(max_depth=8, max_spec_factor=4.0, min_token_prob=0.0), max_draft_len=4)
    # the longest match is (0, 1, 2): followed by 3 twice and 9 once (its latest occurrence, at the
    # end, by nothing yet); after (0, 1, 2, 3) comes 0 both times, then 1
    d.add("r", [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 9, 0, 1, 2])
    assert d.lookup("r", 3) == [3, 0, 1]
    # the longest match decides, even when a shorter suffix has a more frequent continuation
    d.add("s", [7, 0, 1, 2, 9, 0, 1, 2, 3, 0, 1, 2, 3, 7, 0, 1, 2])
    assert d.lookup("s", 1) == [9]


def test_draft_length_grows_with_the_match():
    cfg = SuffixConfig(max_depth=16, max_spec_factor=1.0, min_token_prob=0.0)
    d = SuffixDrafter(cfg, max_draft_len=8)
    d.add("short", [5, 6, 7, 8, 9, 1, 5])      # match (5,): m = 1 -> at most 1 token
    assert d.lookup("short", 8) == [6]
    d.add("long", [5, 6, 7, 8, 9, 1, 5, 6, 7])  # match (5, 6, 7): m = 3 -> 3 tokens
    assert d.lookup("long", 8) == [8, 9, 1]


def test_a_long_match_leaves_room_for_a_full_draft():
    # The trie holds substrings of up to 6 tokens: matching all 5 of (1, 2, 3, 4, 5) would leave room
    # for one token below it; matching (3, 4, 5) leaves room for three.
    d = SuffixDrafter(SuffixConfig(max_depth=6, max_spec_factor=1.0, min_token_prob=0.0), max_draft_len=3)
    d.add("r", [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5])
    assert d.lookup("r", 3) == [6, 7, 8]
    assert d.lookup("r", 1) == [6]


def test_beyond_k_only_a_match_as_long_as_the_draft_drafts():
    # K = 3 for any match; beyond it, an m-token match drafts at most m tokens (up to max_long_draft).
    cfg = SuffixConfig(max_depth=24, max_spec_factor=3.0, min_token_prob=0.0, max_long_draft=12)
    text = list(range(100, 130))                         # 30 distinct tokens: every match is exact
    d = SuffixDrafter(cfg, max_draft_len=16, lookup_len=3)
    d.add("seen", text + text[:8])                       # the text again, 8 tokens in: m = 8
    assert d.lookup("seen", 16) == text[8:16]
    d.add("short", text + [7, 100, 101])                 # only (100, 101) matches: m = 2, K caps it
    assert d.lookup("short", 16) == text[2:5]
    assert d.lookup("seen", 2) == text[8:10]             # a smaller k (an adaptive budget) still caps it
    d.add("deep", text + text[:20])                      # m is capped at D - k = 12: 12 tokens below it
    assert d.lookup("deep", 12) == text[20:30] + text[:2]
    off = SuffixDrafter(SuffixConfig(max_depth=24, min_token_prob=0.0, max_long_draft=0), max_draft_len=16,
                        lookup_len=3)
    off.add("seen", text + text[:8])
    assert off.lookup("seen", 16) == text[8:11]


def test_low_probability_paths_stop_the_draft():
    d = SuffixDrafter(SuffixConfig(max_depth=8, max_spec_factor=4.0, min_token_prob=0.6), max_draft_len=4)
    d.add("r", [0, 1, 2, 0, 1, 3, 0, 1])   # after 0, 1: 2 or 3, each p = 0.5 < 0.6
    assert d.lookup("r", 4) == []


def test_forced_tokens_extend_the_context():
    d = SuffixDrafter(SuffixConfig(max_depth=8, max_spec_factor=4.0, min_token_prob=0.0), max_draft_len=4)
    d.add("r", [7, 1, 2, 3, 4, 7])
    assert d.lookup("r", 2, after=[1, 2]) == [3, 4]
    assert d.stats().request_nodes == SuffixDrafter(d.config, 4).stats().request_nodes + \
        len(substring_counts([[7, 1, 2, 3, 4, 7]], 8))  # `after` was not indexed


def test_finished_outputs_draft_for_later_requests_and_are_bounded():
    cfg = SuffixConfig(max_depth=8, max_spec_factor=4.0, min_token_prob=0.0, max_global_tokens=12)
    d = SuffixDrafter(cfg, max_draft_len=4)
    d.add("a", [100, 101])
    d.commit("a", [20, 21, 22, 23, 24])
    assert d.lookup("a", 3) == []                  # nothing repeats yet
    d.remove("a")
    assert d.stats().global_tokens == 7             # the output after its prompt's tail (D = 8 tokens)
    d.add("b", [100, 102, 20, 21])
    assert d.lookup("b", 3) == [22, 23, 24]        # from a's output
    d.remove("b")                                   # output () -> nothing added
    for i in range(3):                              # 7 + 3 x 6 tokens > 12: a's entry, then c0's, is evicted
        d.add(f"c{i}", [0])
        d.commit(f"c{i}", [50 + i, 60, 61, 62, 63])
        d.remove(f"c{i}")
    s = d.stats()
    assert s.global_tokens == 12 and s.global_outputs == 2
    assert all_paths(d.global_trie) == dict(substring_counts([[0, 51, 60, 61, 62, 63], [0, 52, 60, 61, 62, 63]], 8))
    d.add("e", [20, 21])
    assert d.lookup("e", 3) == []                  # a's output is gone


def test_a_prompt_seen_before_drafts_its_output_from_the_first_token():
    d = SuffixDrafter(SuffixConfig(max_depth=8, min_token_prob=0.0), max_draft_len=4)
    d.add("p", [40, 1, 2, 3, 4, 5, 6])
    d.commit("p", [30, 31, 32])
    d.remove("p")                                   # the global trie: (1 .. 6, 30, 31, 32) and the 40
    d.add("q", [41, 1, 2, 3, 4, 5, 6])              # the same prompt tail: no output yet
    assert d.lookup("q", 3) == [30, 31, 32]
    assert d.global_trie.count([4, 5, 6, 30]) == 1 and d.global_trie.count([41]) == 0


def test_the_request_trie_wins_ties_and_state_is_freed():
    d = SuffixDrafter(SuffixConfig(max_depth=8, max_spec_factor=4.0, min_token_prob=0.0), max_draft_len=2)
    d.add("x", [0])
    d.commit("x", [1, 2, 3])
    d.remove("x")                                   # global: after 1 comes 2
    d.add("y", [1, 5, 1])                   # own: after 1 comes 5 (same score)
    assert d.lookup("y", 1) == [5]
    d.remove("y")
    d.remove("y")                                   # idempotent
    assert d.stats().requests == 0 and d.stats().request_nodes == 0
    with pytest.raises(RequestError):
        d.lookup("y", 1)
    with pytest.raises(ValueError):
        SuffixConfig(max_depth=1)


def test_trie_nodes_are_not_objects_the_garbage_collector_walks():
    # One tracked object per node made the collector's passes cost more than drafting (suffix.py).
    import gc

    trie = SuffixTrie(24)
    before = len(gc.get_objects())
    trie.add([i % 97 for i in range(2000)])
    assert trie.nodes > 2000
    assert len(gc.get_objects()) - before < 20


def test_only_branching_nodes_hold_a_dict_and_freed_nodes_are_reused():
    # A dict per node made the global trie ~3x larger (suffix.py): a node's only child lives in two
    # list slots, and a dict comes with a second child and goes when one is left.
    trie = SuffixTrie(8)
    trie.add(list(range(100, 150)))                 # distinct tokens: only the root branches
    assert sum(kids is not None for kids in trie._kids) == 1
    trie.add([100, 101, 7])                          # (100, 101) and (101,) go on with 102 or 7
    assert sum(kids is not None for kids in trie._kids) == 3     # with the root
    trie.remove([100, 101, 7])
    assert sum(kids is not None for kids in trie._kids) == 1
    trie.add([1, 2, 3, 4])
    trie.remove([1, 2, 3, 4])
    used = trie._used
    for _ in range(3):                               # the same nodes, freed and taken again
        trie.add([1, 2, 3, 4])
        trie.remove([1, 2, 3, 4])
    assert trie._used == used
    assert all_paths(trie) == dict(substring_counts([list(range(100, 150))], 8))


def test_siblings_are_the_runners_up_of_each_drafted_node():
    trie = SuffixTrie(max_depth=6)
    for s in ([1, 2, 3, 7], [1, 2, 4, 7], [1, 2, 4, 8], [1, 2, 5, 7]):
        trie.add(s)
    # after (1, 2): 4 twice, then 3 and 5 once each (5 seen last: first among equals); after (1, 2, 4): 7 and 8
    draft = trie.propose([1, 2], 2, factor=4.0, min_prob=0.0, siblings=2)
    assert draft.tokens == (4, 8) and draft.siblings == ((5, 3), (7,))
    assert trie.propose([1, 2], 2, factor=4.0, min_prob=0.0, siblings=1).siblings == ((5,), (7,))
    plain = trie.propose([1, 2], 2, factor=4.0, min_prob=0.0)
    assert plain.tokens == draft.tokens and plain.siblings == ()


def test_lookup_draft_is_lookup_with_its_siblings():
    d = SuffixDrafter(SuffixConfig(max_depth=8, max_spec_factor=4.0, min_token_prob=0.0), max_draft_len=4)
    d.add("r", [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 9, 0, 1, 2])
    found = d.lookup_draft("r", 3, siblings=1)
    assert list(found.tokens) == d.lookup("r", 3) == [3, 0, 1]
    assert found.siblings[0] == (9,) and len(found.siblings) == 3
