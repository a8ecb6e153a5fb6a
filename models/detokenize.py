"""Incremental detokenization: text deltas that never split a UTF-8 character or leak a stop string."""
from __future__ import annotations

from collections.abc import Sequence

from interlock.models.tokenizer import Tokenizer
from interlock.protocol.types import TokenId

_REPLACEMENT = "\ufffd"


class IncrementalText:
    """Feed token ids, get back the text that is final so far.

    Text ending in U+FFFD (a multi-byte character cut by a token boundary) is held back until the
    next token completes it; so are the last few characters that could be the start of a stop
    string. `stop_hit` is set once a stop string appears; the text before it is all that is emitted.
    """

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.ids: list[TokenId] = []
        self.emitted = 0                # characters of the decoded text already handed out
        self.stop_hit = False
        self._holdback = max((len(s) for s in self.stop), default=1) - 1

    def push(self, ids: Sequence[TokenId], final: bool = False) -> str:
        """Append ids; return the newly final text (everything left, when final)."""
        self.ids.extend(ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        for s in self.stop:
            at = text.find(s, max(0, self.emitted - len(s)))
            if at != -1:
                self.stop_hit, final = True, True
                text = text[:at]
        end = len(text)
        if not final:
            if text.endswith(_REPLACEMENT):
                end = len(text.rstrip(_REPLACEMENT))
            end = max(self.emitted, end - self._holdback)
        delta = text[self.emitted:end]
        self.emitted = max(self.emitted, end)
        return delta
