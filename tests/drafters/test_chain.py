"""DraftChain: forced tokens first, the n-gram continuation past them, a user drafter where the
grammar forces nothing; the adaptive budget; a failing user drafter fails only its requests."""
from __future__ import annotations

from interlock.drafters.chain import ChainRequest, DraftChain
from interlock.protocol.errors import DrafterError
from interlock.protocol.speculative import SpeculativeConfig


def test_forced_tokens_come_first_and_the_ngram_continues_past_them() -> None:
    chain = DraftChain(SpeculativeConfig(("ngram", "forced"), max_draft_len=4), vocab_size=100)
    chain.add("a", (1, 2, 3, 4, 5, 6, 1, 2))
    (only_ngram, forced) = chain.propose([ChainRequest("a", ()), ChainRequest("a", (9, 3))])
    assert only_ngram.drafts == (3, 4, 5, 6) and only_ngram.k == 4
    assert forced.drafts == (9, 3, 4, 5)        # forced first; the lookup continues after (..., 9, 3)


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
    assert chain.counts() == {"ngram_requests": 1, "adaptive_budgets": 1, "user_contexts": 0}
    chain.remove("a")
    assert chain.counts() == {"ngram_requests": 0, "adaptive_budgets": 0, "user_contexts": 0}


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
