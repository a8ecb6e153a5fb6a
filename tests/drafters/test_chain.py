"""DraftChain: forced tokens first, the n-gram continuation past them, a user drafter where the
grammar forces nothing; the adaptive budget; a failing user drafter fails only its requests."""
from __future__ import annotations

from interlock.drafters.chain import ChainRequest, DraftChain
from interlock.protocol.errors import DrafterError
from interlock.protocol.speculative import SpeculativeConfig, SuffixConfig


def test_forced_tokens_come_first_and_the_ngram_continues_past_them() -> None:
    chain = DraftChain(SpeculativeConfig(("ngram", "forced"), max_draft_len=4), vocab_size=100)
    chain.add("a", (1, 2, 3, 4, 5, 6, 1, 2))
    (only_ngram, forced) = chain.propose([ChainRequest("a", ()), ChainRequest("a", (9, 3))])
    assert only_ngram.drafts == (3, 4, 5, 6) and only_ngram.k == 4
    assert forced.drafts == (9, 3, 4, 5)        # forced first; the lookup continues after (..., 9, 3)


def test_suffix_drafts_follow_the_forced_tokens_and_finished_outputs_feed_the_global_trie() -> None:
    spec = SpeculativeConfig(("suffix", "forced"), max_draft_len=4,
                             suffix=SuffixConfig(max_depth=8, max_spec_factor=4.0, min_token_prob=0.0))
    chain = DraftChain(spec, vocab_size=100)
    chain.add("a", (1, 2))
    chain.commit("a", (7, 8, 9, 10, 11), drafted=0, accepted=0)
    assert chain.propose([ChainRequest("a", (7, 8))])[0].drafts == (7, 8, 9, 10)   # forced, then the trie
    chain.remove("a")                                   # its output (7 8 9 10 11) joins the global trie
    counts = chain.counts()
    assert counts["suffix_requests"] == counts["suffix_request_nodes"] == 0 and counts["suffix_global_tokens"] == 5
    chain.add("b", (3, 7, 8))                           # never saw 9 after 8 itself: the global trie did
    assert chain.propose([ChainRequest("b", ())])[0].drafts == (9, 10, 11)
    assert chain.propose([ChainRequest("b", (9,))])[0].drafts == (9, 10, 11)


def test_forced_tokens_are_ignored_unless_forced_is_a_drafter() -> None:
    chain = DraftChain(SpeculativeConfig(("ngram",), max_draft_len=2), vocab_size=100)
    chain.add("a", (5, 6))
    assert chain.propose([ChainRequest("a", (42, 43))])[0].drafts != (42, 43)


def test_adaptive_budget_grows_on_full_acceptance_and_shrinks_on_rejection() -> None:
    chain = DraftChain(SpeculativeConfig(("ngram",), max_draft_len=4, adaptive=True), vocab_size=100)
    chain.add("a", (1, 2))
    chain.commit("a", (3,), drafted=4, accepted=0)
    assert chain.propose([ChainRequest("a", ())])[0].k == 1
    chain.commit("a", (4, 5), drafted=1, accepted=1)
    assert chain.propose([ChainRequest("a", ())])[0].k == 2
    no_suffix = {"suffix_requests": 0, "suffix_request_nodes": 0, "suffix_global_tokens": 0, "suffix_global_nodes": 0}
    assert chain.counts() == {"ngram_requests": 1, "adaptive_budgets": 1, "user_contexts": 0} | no_suffix
    chain.remove("a")
    assert chain.counts() == {"ngram_requests": 0, "adaptive_budgets": 0, "user_contexts": 0} | no_suffix


class Picky:
    def propose(self, requests, k):
        if any(r.request_id == "bad" for r in requests):
            raise RuntimeError("boom")
        return [[7, 8, 9] for _ in requests]


def test_a_user_drafter_that_raises_fails_only_the_request_it_raises_for() -> None:
    chain = DraftChain(SpeculativeConfig((), max_draft_len=3, user_drafter=Picky()), vocab_size=100)
    for rid in ("good", "bad"):
        chain.add(rid, (1, 2))
    good, bad = chain.propose([ChainRequest("good", ()), ChainRequest("bad", ())])
    assert good.drafts == (7, 8, 9) and good.error is None
    assert isinstance(bad.error, DrafterError)
