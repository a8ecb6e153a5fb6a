"""Incremental text: never a split UTF-8 character, never a leaked stop string."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from interlock.output.detokenize import IncrementalText


def stream(tiny_tokenizer, text: str, stop=()) -> tuple[list[str], IncrementalText]:
    inc = IncrementalText(tiny_tokenizer, stop)
    ids = tiny_tokenizer.encode(text)
    pieces = [inc.push([t]) for t in ids[:-1]] + [inc.push(ids[-1:], final=True)]
    return pieces, inc


def test_multibyte_characters_are_never_split(tiny_tokenizer) -> None:
    text = "héllo wörld — 東京 ✓"
    ids = tiny_tokenizer.encode(text)
    assert any("\ufffd" in tiny_tokenizer.decode([t]) for t in ids)        # the tiny vocabulary splits them
    pieces, _ = stream(tiny_tokenizer, text)
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_stop_string_ends_the_text_and_never_leaks(tiny_tokenizer) -> None:
    pieces, inc = stream(tiny_tokenizer, "alpha beta STOP gamma", stop=("STOP",))
    assert inc.stop_hit and "".join(pieces) == "alpha beta "


def test_text_without_stop_is_emitted_whole(tiny_tokenizer) -> None:
    pieces, inc = stream(tiny_tokenizer, "no stop here", stop=("XYZ",))
    assert not inc.stop_hit and "".join(pieces) == "no stop here"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.integers(0, 1023), min_size=1, max_size=60), cuts=st.lists(st.integers(1, 4), max_size=60))
def test_pieces_join_to_the_full_decode(tiny_tokenizer, ids: list[int], cuts: list[int]) -> None:
    # Any ids (special tokens and bytes of split characters included), pushed in any step sizes.
    inc = IncrementalText(tiny_tokenizer)
    pieces, i = [], 0
    for n in cuts:
        if i + n >= len(ids):
            break
        pieces.append(inc.push(ids[i: i + n]))
        i += n
    pieces.append(inc.push(ids[i:], final=True))
    assert "".join(pieces) == tiny_tokenizer.decode(ids, skip_special_tokens=True)
    assert all(not p.endswith("\ufffd") for p in pieces[:-1])


def test_a_push_decodes_only_its_own_tokens(tiny_tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Decoding every id at every push made a long output quadratic; only the last push decodes all.
    calls: list[int] = []
    real = type(tiny_tokenizer).decode
    monkeypatch.setattr(type(tiny_tokenizer), "decode", lambda self, ids, **kw: calls.append(len(ids)) or real(self, ids, **kw))
    pieces, _ = stream(tiny_tokenizer, "a long enough text, pushed one token at a time " * 4)
    assert len(pieces) > 20 and len(calls) == 1
