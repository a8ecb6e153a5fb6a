"""Incremental detokenization: text deltas that never split a UTF-8 character or leak a stop string."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from interlock.models.tokenizer import Tokenizer
from interlock.protocol.types import TokenId

_REPLACEMENT = "\ufffd"


def _decode_stream(tokenizer: Tokenizer) -> tuple[Any, Any] | None:
    """(tokenizers' DecodeStream, the backend it steps) when the tokenizer streams exactly like its
    full decode; None otherwise (a slow tokenizer, or transformers' clean-up of spaces, which the
    backend never applies)."""
    backend = getattr(tokenizer.hf, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer.hf, "clean_up_tokenization_spaces", False):
        return None
    try:
        from tokenizers.decoders import DecodeStream
    except ImportError:
        return None
    return DecodeStream(skip_special_tokens=True), backend


class IncrementalText:
    """Feed token ids, get back the text that is final so far.

    Text ending in U+FFFD (a multi-byte character cut by a token boundary) is held back until the
    next token completes it; so are the last few characters that could be the start of a stop
    string. `stop_hit` is set once a stop string appears; the text before it is all that is emitted.

    Each push costs what its own tokens cost: tokenizers' DecodeStream decodes a small window
    around each new token (decoding all ids every step made a 3,000-token output cost ~0.3 ms a
    step, and the whole request O(n^2)). The last push decodes everything once, so the final text
    is exactly `tokenizer.decode(ids, skip_special_tokens=True)`, a cut UTF-8 character included.
    """

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.ids: list[TokenId] = []
        self.emitted = 0                # characters of the decoded text already handed out
        self.stop_hit = False
        self._holdback = max((len(s) for s in self.stop), default=1) - 1
        self._stream = _decode_stream(tokenizer)
        self._text = ""                 # what the stream has produced so far (whole characters)

    def push(self, ids: Sequence[TokenId], final: bool = False) -> str:
        """Append ids; return the newly final text (everything left, when final)."""
        self.ids.extend(ids)
        text = self._decoded(ids, final)
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

    def _decoded(self, ids: Sequence[TokenId], final: bool) -> str:
        """The text of all ids so far (for a non-final push: up to its last whole character)."""
        if self._stream is not None and not final:
            stream, backend = self._stream
            try:
                for t in ids:
                    piece = stream.step(backend, t)
                    if piece:
                        self._text += piece
                return self._text
            except Exception:  # noqa: BLE001 - an id the backend refuses: decode whole from now on
                self._stream = None
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)
