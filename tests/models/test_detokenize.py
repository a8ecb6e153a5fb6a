"""Incremental text: never a split UTF-8 character, never a leaked stop string."""
from __future__ import annotations

import pytest

from interlock.models.detokenize import IncrementalText
from interlock.models.loader import load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def stream(tok, text: str, stop=()) -> tuple[list[str], IncrementalText]:
    inc = IncrementalText(tok, stop)
    ids = tok.encode(text)
    pieces = [inc.push([t]) for t in ids[:-1]] + [inc.push(ids[-1:], final=True)]
    return pieces, inc


def test_multibyte_characters_are_never_split(tok) -> None:
    text = "héllo wörld — 東京 ✓"
    ids = tok.encode(text)
    assert any("\ufffd" in tok.decode([t]) for t in ids)        # the tiny vocabulary splits them
    pieces, _ = stream(tok, text)
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_stop_string_ends_the_text_and_never_leaks(tok) -> None:
    pieces, inc = stream(tok, "alpha beta STOP gamma", stop=("STOP",))
    assert inc.stop_hit and "".join(pieces) == "alpha beta "


def test_text_without_stop_is_emitted_whole(tok) -> None:
    pieces, inc = stream(tok, "no stop here", stop=("XYZ",))
    assert not inc.stop_hit and "".join(pieces) == "no stop here"
