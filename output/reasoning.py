"""Splitting a Reasoning output's text, as it streams, into the thinking and the answer: the one
splitter, for the engine (which knows the tokens) and the server (which sees only text).

Where it switches: with a tokenizer, the first place the output's text (special tokens kept) holds
the end marker, which the grammar makes end on a token boundary (grammars/triggers.py); without
one, the first place the delivered text holds it (a marker a decode dropped, a special token, is not
seen then). A leading start marker is dropped from the thinking, the end marker from both; text
that may still begin the end marker is held back until the next piece shows whether it does.
"""
from __future__ import annotations

from collections.abc import Sequence

from interlock.models.tokenizer import Tokenizer
from interlock.protocol.grammar import Reasoning
from interlock.protocol.types import TokenId


class ReasoningStream:
    """One output's split. `feed` each delivered piece; `finish` when it ends while thinking.

    reasoning: all the thinking handed out so far. done: the answer has begun, or the output ended.
    """

    def __init__(self, tokenizer: Tokenizer | None, start: str, end: str) -> None:
        self._tok = tokenizer
        self._start = start
        self._end = end
        self._ids: list[TokenId] = []
        self._text = ""                  # everything delivered so far
        self._thought_at = 0             # characters of _text handed out as thinking (or skipped)
        self._switch: tuple[int, int] | None = None   # (end marker's first char, first char after it)
        self._answer_at = 0
        self.reasoning = ""
        self.ended = False

    @classmethod
    def of_text(cls, markers: Reasoning = Reasoning()) -> ReasoningStream:
        """A splitter that sees text only (the server's, for a model that thinks in its text)."""
        return cls(None, markers.start, markers.end)

    @property
    def switched(self) -> bool:
        return self._switch is not None

    @property
    def done(self) -> bool:
        return self.switched or self.ended

    def feed(self, tokens: Sequence[TokenId], text: str, final: bool = False) -> tuple[str, str]:
        """(thinking, answer) text to deliver for these tokens (none without a tokenizer) and their text."""
        first_new = len(self._ids)
        self._ids.extend(int(t) for t in tokens)
        self._text += text
        if self._switch is None:
            self._find_switch(first_new)
        if self._thought_at == 0 and not final and self._start.startswith(self._text[:len(self._start)]) \
                and len(self._text) < len(self._start):
            return "", ""                # may still become the start marker
        if self._thought_at == 0 and self._text.startswith(self._start):
            self._thought_at = len(self._start)
        if self._switch is not None:
            upto, answer_from = self._switch
        else:
            upto = len(self._text) - (0 if final else self._partial())
            answer_from = None
        upto = min(upto, len(self._text))
        thought = self._text[self._thought_at:upto] if upto > self._thought_at else ""
        self._thought_at = max(self._thought_at, upto)
        self.reasoning += thought
        answer = ""
        if answer_from is not None:
            start = max(answer_from, self._answer_at)
            answer = self._text[start:]
            self._answer_at = max(start, len(self._text))
        self.ended = self.ended or final
        return thought, answer

    def finish(self) -> str:
        """The output ended while thinking: what was held back is thinking too."""
        return self.feed((), "", final=True)[0]

    def _find_switch(self, first_new: int) -> None:
        if self._tok is None:
            at = self._text.find(self._end, self._thought_at)
            if at >= 0:
                self._switch = (at, at + len(self._end))
            return
        # Each token holds at least one byte, so a marker ending in the new tokens began at most
        # len(marker) tokens before them.
        lo = max(0, first_new - len(self._end.encode()))
        for m in range(max(first_new, 1), len(self._ids) + 1):
            if self._end in self._tok.decode(self._ids[lo:m]):
                # (A native grammar may switch mid-token: the answer starts right after the marker.)
                at = self._tok.decode(self._ids[:m]).find(self._end)
                self._switch = (at, at + len(self._end))
                return

    def _partial(self) -> int:
        """Characters at the end of the text that could begin the end marker."""
        if self._tok is None:
            tail = self._text[self._thought_at:]
        else:
            tail = self._tok.decode(self._ids[-len(self._end.encode()):]) if self._ids else ""
        return next((k for k in range(min(len(tail), len(self._end) - 1), 0, -1)
                     if tail.endswith(self._end[:k])), 0)
