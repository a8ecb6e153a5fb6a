"""`--speculative` strings: drafters, their arguments and options, and the errors for nonsense."""
from __future__ import annotations

import pytest

from interlock.protocol.speculative import SELF_DRAFT_LAYERS, NGramConfig, SpeculativeConfig, SuffixConfig


def test_none_disables_speculation() -> None:
    assert SpeculativeConfig.parse("none") is None and SpeculativeConfig.parse(None) is None


@pytest.mark.parametrize("text, drafters, fields", [
    ("ngram+forced", ("ngram", "forced"), {}),
    ("ngram+forced+adaptive", ("ngram", "forced"), {"adaptive": True}),
    ("self-draft+forced", ("self-draft", "forced"), {"self_draft_layers": SELF_DRAFT_LAYERS}),
    ("self-draft:6+nomask", ("self-draft",), {"self_draft_layers": 6, "draft_masking": False}),
    ("draft:/models/Tiny Draft.gguf+forced", ("draft", "forced"), {"draft_model": "/models/Tiny Draft.gguf"}),
    ("Forced + NGRAM", ("forced", "ngram"), {}),
    ("ngram:3+forced", ("ngram", "forced"), {"ngram": NGramConfig(max_matching_ngram_size=3)}),
    ("ngram+forced:0", ("ngram", "forced"), {"forced_extra": 0, "step_drafts": 4}),
    ("ngram+forced:5", ("ngram", "forced"), {"forced_extra": 5, "step_drafts": 9}),
    ("ngram+forced", ("ngram", "forced"), {"step_drafts": 4 + SpeculativeConfig.forced_extra}),
    ("ngram", ("ngram",), {"step_drafts": 4}),        # no forced drafter: no rows for forced tokens
    # the suffix drafter's long drafts get rows of their own: max_long_draft (12 <= max_depth / 2) over K
    ("suffix+forced", ("suffix", "forced"), {"lookup_drafts": 12, "step_drafts": 12 + SpeculativeConfig.forced_extra}),
    ("suffix", ("suffix",), {"step_drafts": 12}),
])
def test_parse(text: str, drafters: tuple[str, ...], fields: dict) -> None:
    config = SpeculativeConfig.parse(text, max_draft_len=4)
    assert config is not None and config.drafters == drafters and config.max_draft_len == 4
    for name, value in fields.items():
        assert getattr(config, name) == value
    assert SpeculativeConfig.parse(config.label, max_draft_len=4) == config     # the label round-trips


@pytest.mark.parametrize("text, message", [
    ("eagle", "unknown drafter"),
    ("draft", "draft:PATH"),
    ("self-draft:x", "number of layers"),
    ("forced:x", "forced:N needs"),
    ("forced:17", "forced_extra"),
    ("ngram+adaptive:3", "takes no argument"),
    ("ngram:x", "longest suffix"),
    ("ngram:0", "longest suffix"),
    ("self-draft+draft:/m", "one draft model"),
    ("self-draft:0", "self_draft_layers"),
    ("adaptive", "no drafters"),
])
def test_nonsense_is_a_value_error_that_says_why(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.parse(text)


def test_long_suffix_drafts_are_sized_by_what_the_trie_can_hold() -> None:
    def rows(**suffix: int) -> int:
        return SpeculativeConfig(("suffix",), max_draft_len=3, suffix=SuffixConfig(**suffix)).lookup_drafts

    assert rows(max_long_draft=12, max_depth=24) == 12
    assert rows(max_long_draft=12, max_depth=16) == 8       # an 8-token match, 8 tokens below it
    assert rows(max_long_draft=0) == 3                      # off: K caps every draft
    assert rows(max_long_draft=2) == 3                      # never fewer than K
    with pytest.raises(ValueError, match="max_long_draft"):
        SuffixConfig(max_long_draft=17)
