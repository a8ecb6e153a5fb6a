"""Hypothesis: n-gram proposals against a brute-force scan of the sequences themselves."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.drafters.ngram import NGramDrafter
from interlock.protocol.speculative import NGramConfig

TOKENS = st.lists(st.integers(0, 3), max_size=40)   # a small alphabet makes repeats common


def occurrences(seqs: list[list[int]], suffix: list[int]) -> list[tuple[list[int], int]]:
    """Every (seq, e) with seq[e - n:e] == suffix and e < len(seq), oldest first within a seq."""
    n = len(suffix)
    return [(s, e) for s in seqs for e in range(n, len(s)) if s[e - n:e] == suffix]


def longest_match(seqs: list[list[int]], cur: list[int], max_n: int) -> list[tuple[list[int], int]]:
    """Occurrences of the longest suffix of cur (up to max_n tokens) found anywhere in seqs."""
    for n in range(min(max_n, len(cur)), 0, -1):
        occs = occurrences(seqs, cur[-n:])
        if occs:
            return occs
    return []


def reference_private(cur: list[int], cfg: NGramConfig, k: int) -> list[int]:
    """What the documented options pick, recomputed by scanning one request's sequence."""
    occs = longest_match([cur], cur, cfg.max_matching_ngram_size)
    if not occs or k == 0:
        return []
    conts = [s[e:e + k] for s, e in occs]
    if not cfg.is_keep_all or len(conts) == 1:
        return conts[0] if cfg.is_use_oldest else conts[-1]
    ordered = conts if cfg.is_use_oldest else conts[::-1]
    looked = ordered[:k + 1]
    full = [c for c in looked if len(c) == k]
    return full[0] if full else max(looked, key=len)


configs = st.builds(
    NGramConfig,
    max_matching_ngram_size=st.integers(1, 4),
    is_keep_all=st.booleans(),
    is_use_oldest=st.booleans(),
    is_public_pool=st.just(False),
)


@settings(max_examples=150, deadline=None)
@given(cfg=configs, d=st.integers(1, 5), prompt=TOKENS,
       chunks=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), max_size=6),
       data=st.data())
def test_private_pool_matches_brute_force(cfg: NGramConfig, d: int, prompt: list[int],
                                          chunks: list[list[int]], data: st.DataObject) -> None:
    drafter = NGramDrafter(cfg, max_draft_len=d)
    drafter.add("r", prompt)
    cur = list(prompt)
    for chunk in [[]] + chunks:
        drafter.commit("r", chunk)
        cur += chunk
        k = data.draw(st.integers(0, d))
        got = drafter.lookup("r", k)
        assert got == reference_private(cur, cfg, k)
        # Independently of which occurrence the options pick: a real continuation, never empty
        # when some suffix occurred before.
        occs = longest_match([cur], cur, cfg.max_matching_ngram_size)
        if k and occs:
            assert got and any(s[e:e + len(got)] == got for s, e in occs)


@settings(max_examples=100, deadline=None)
@given(cfg=configs.map(lambda c: NGramConfig(c.max_matching_ngram_size, c.is_keep_all,
                                             c.is_use_oldest, is_public_pool=True)),
       d=st.integers(1, 5), prompts=st.lists(TOKENS, min_size=2, max_size=3),
       steps=st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 3), max_size=3),
                                st.booleans()), max_size=12),
       data=st.data())
def test_public_pool_proposes_continuations_seen_in_some_request(
        cfg: NGramConfig, d: int, prompts: list[list[int]],
        steps: list[tuple[int, list[int], bool]], data: st.DataObject) -> None:
    drafter = NGramDrafter(cfg, max_draft_len=d)
    seen: list[list[int]] = []          # every sequence the pool was taught, removed ones included
    live: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        drafter.add(str(i), p)
        live[str(i)] = list(p)
        seen.append(live[str(i)])
    for who, chunk, drop in steps:
        rid = str(who % len(prompts))
        if rid not in live:
            continue
        drafter.commit(rid, chunk)
        live[rid] += chunk
        k = data.draw(st.integers(1, d))
        got = drafter.lookup(rid, k)
        occs = longest_match(seen, live[rid], cfg.max_matching_ngram_size)
        assert bool(got) == bool(occs)
        assert len(got) <= k
        assert any(s[e:e + len(got)] == got and len(got) == min(k, len(s) - e) for s, e in occs) or not got
        if drop and len(live) > 1:
            drafter.remove(rid)
            del live[rid]


@settings(max_examples=60, deadline=None)
@given(cfg=configs, prompt=TOKENS, chunks=st.lists(st.lists(st.integers(0, 3), max_size=4), max_size=6))
def test_extend_in_pieces_equals_adding_everything_at_once(cfg: NGramConfig, prompt: list[int],
                                                          chunks: list[list[int]]) -> None:
    pieces, whole = NGramDrafter(cfg, 4), NGramDrafter(cfg, 4)
    pieces.add("r", prompt)
    for chunk in chunks:
        pieces.commit("r", chunk)
    whole.add("r", prompt + [t for c in chunks for t in c])
    assert pieces.stats() == whole.stats()
    assert [pieces.lookup("r", k) for k in range(5)] == [whole.lookup("r", k) for k in range(5)]
