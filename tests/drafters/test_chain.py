"""DraftChain: forced tokens first, the n-gram continuation past them, a user drafter, the longest
consistent answer; the adaptive budget; when the draft model is asked; a failing user drafter fails
only its requests; per-request state through the Tracked hooks."""
from __future__ import annotations

from interlock.drafters.chain import ChainRequest, DraftChain
from interlock.protocol.errors import DrafterError
from interlock.protocol.speculative import SpeculativeConfig, SuffixConfig


def test_forced_tokens_come_first_and_the_ngram_continues_past_them() -> None:
    chain = DraftChain(SpeculativeConfig(("ngram", "forced"), max_draft_len=4, forced_extra=2), vocab_size=100)
    chain.add("a", (1, 2, 3, 4, 5, 6, 1, 2))
    (only_ngram, forced, long) = chain.propose([ChainRequest("a", ()), ChainRequest("a", (9, 3)),
                                                ChainRequest("a", (9, 3, 4, 5, 6, 1, 2, 3))])
    assert only_ngram.drafts == (3, 4, 5, 6) and only_ngram.k == 4
    # forced first, in rows of their own; the lookup still gets K = 4 after (..., 9, 3), within K + 2
    assert forced.drafts == (9, 3, 4, 5, 6, 1) and forced.k == 6
    assert long.drafts == (9, 3, 4, 5, 6, 1) and long.k == 6     # a long forced run: K + 2 at most


def test_forced_extra_zero_counts_forced_tokens_against_k() -> None:
    chain = DraftChain(SpeculativeConfig(("ngram", "forced"), max_draft_len=4, forced_extra=0), vocab_size=100)
    chain.add("a", (1, 2, 3, 4, 5, 6, 1, 2))
    assert chain.propose([ChainRequest("a", (9, 3))])[0].drafts == (9, 3, 4, 5)


def test_suffix_drafts_follow_the_forced_tokens_and_finished_outputs_feed_the_global_trie() -> None:
    spec = SpeculativeConfig(("suffix", "forced"), max_draft_len=4,
                             suffix=SuffixConfig(max_depth=8, max_spec_factor=4.0, min_token_prob=0.0))
    chain = DraftChain(spec, vocab_size=100)
    chain.add("a", (1, 2))
    chain.commit("a", (7, 8, 9, 10, 11), drafted=0, accepted=0)
    assert chain.propose([ChainRequest("a", (7, 8))])[0].drafts == (7, 8, 9, 10, 11)   # forced, then the trie
    chain.remove("a")                                   # its output (7 8 9 10 11) joins the global trie,
    counts = chain.counts()                             # after its prompt's tail (1 2)
    assert counts["suffix_requests"] == counts["suffix_request_nodes"] == 0 and counts["suffix_global_tokens"] == 7
    chain.add("b", (3, 7, 8))                           # never saw 9 after 8 itself: the global trie did
    assert chain.propose([ChainRequest("b", ())])[0].drafts == (9, 10, 11)
    assert chain.propose([ChainRequest("b", (9,))])[0].drafts == (9, 10, 11)


def test_suffix_drafts_go_past_k_on_long_matches_while_the_budget_is_whole() -> None:
    spec = SpeculativeConfig(("suffix", "ngram", "forced"), max_draft_len=3, forced_extra=2, adaptive=True,
                             suffix=SuffixConfig(max_depth=24, min_token_prob=0.0, max_long_draft=12))
    assert spec.step_drafts == 14
    chain = DraftChain(spec, vocab_size=200)
    text = tuple(range(100, 130))
    chain.add("a", text + text[:8])                    # its own text again: an 8-token match
    (plain, forced) = chain.propose([ChainRequest("a", ()), ChainRequest("a", text[8:10])])
    assert plain.drafts == text[8:16] and plain.k == 3          # k: the budget the draft model would get
    assert forced.drafts == text[8:20] and forced.k == 5        # forced first; the match is then 10 long
    chain.commit("a", text[8:9], drafted=8, accepted=0)         # a rejection: the budget drops to 1
    assert chain.propose([ChainRequest("a", ())])[0].drafts == text[9:10]


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
    counts = chain.counts()
    assert (counts["ngram_requests"], counts["adaptive_budgets"], counts["user_contexts"]) == (1, 1, 0)
    chain.remove("a")
    assert set(chain.counts().values()) == {0}


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


class Echo:
    """A stateless user drafter: answers its last token k times (it reads DraftRequest.tokens)."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def propose(self, requests, k):
        self.seen.extend((r.request_id, r.tokens, r.forced) for r in requests)
        return [[r.tokens[-1]] * k for r in requests]


def test_a_stateless_user_drafter_gets_the_tokens_and_forced_tokens_and_is_cut_where_it_disagrees() -> None:
    echo = Echo()
    chain = DraftChain(SpeculativeConfig(("forced",), max_draft_len=3, user_drafter=echo), vocab_size=100)
    chain.add("a", (1, 2))
    chain.commit("a", (5,), drafted=0, accepted=0)
    assert chain.propose([ChainRequest("a", ())])[0].drafts == (5, 5, 5)
    assert chain.propose([ChainRequest("a", (5, 6))])[0].drafts == (5, 6)   # its (5, 5, 5) is cut at 5 != 6
    assert chain.propose([ChainRequest("a", (7,))])[0].drafts == (7,)       # cut to nothing: forced wins
    assert echo.seen[0] == ("a", (1, 2, 5), ()) and echo.seen[1] == ("a", (1, 2, 5), (5, 6))
    assert chain.counts()["user_contexts"] == 1
    chain.remove("a")
    assert chain.counts()["user_contexts"] == 0


class Counting(Echo):
    """A user drafter with the Tracked hooks: it keeps its own state, so it is handed no tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[str, list[int]] = {}

    def add(self, request_id, prompt):
        self.held[request_id] = list(prompt)

    def commit(self, request_id, new_tokens):
        self.held[request_id].extend(new_tokens)

    def remove(self, request_id):
        self.held.pop(request_id, None)

    def counts(self):
        return {"user_held": len(self.held)}

    def propose(self, requests, k):
        assert all(r.tokens == () for r in requests)
        return [[self.held[r.request_id][-1]] * k for r in requests]


def test_a_tracked_user_drafter_gets_the_hooks_and_its_counts_are_reported() -> None:
    user = Counting()
    chain = DraftChain(SpeculativeConfig((), max_draft_len=2, user_drafter=user), vocab_size=100)
    chain.add("a", (1, 2))
    chain.commit("a", (9,), drafted=0, accepted=0)
    assert chain.propose([ChainRequest("a", ())])[0].drafts == (9, 9)
    assert chain.counts()["user_held"] == 1 and chain.counts()["user_contexts"] == 0
    chain.remove("a")
    assert chain.counts()["user_held"] == 0


def test_the_draft_model_is_asked_only_where_the_lookups_fall_short() -> None:
    class FakeModel(Counting):       # only the Tracked hooks matter to the chain
        pass

    chain = DraftChain(SpeculativeConfig(("ngram", "forced"), max_draft_len=3), vocab_size=100, model=FakeModel())
    chain.add("a", (1, 2, 3, 1, 2))
    full, short = chain.propose([ChainRequest("a", ()), ChainRequest("a", (7,))])
    assert full.drafts == (3, 1, 2) and not full.model
    assert short.drafts == (7,) and short.model
