"""The engine's TokenLogprobs in OpenAI's two shapes.

chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}
completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}

A token's "bytes" are its raw UTF-8 bytes (a byte-level BPE token may hold part of a character);
its "token" is those bytes decoded, a partial character as U+FFFD. text_offset counts characters
of the concatenated token strings from the start of the completion (as vLLM does): it equals the
text's offsets wherever every token decodes to whole characters.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from interlock.models.tokenizer import Tokenizer
from interlock.protocol.sampling import TokenLogprob


def byte_level_alphabet() -> list[str]:
    """The stand-in character of each byte 0..255 in byte-level BPE pieces (GPT-2's convention:
    printable Latin-1 bytes stand for themselves, the others shift to 256+). The same table as
    interlock.testing.tokenizers builds its test tokenizer with; not imported from there, as
    interlock.testing needs hypothesis, a test dependency."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    shifted = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(shifted)) for b in range(256)]


class TokenTexts:
    """Token id -> (string, bytes), cached (at most one entry per vocabulary id)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        decoder = getattr(getattr(tokenizer.hf, "backend_tokenizer", None), "decoder", None)
        # Byte-level BPE pieces spell bytes with stand-in characters; map them back exactly.
        self._byte_of = ({ch: b for b, ch in enumerate(byte_level_alphabet())}
                         if type(decoder).__name__ == "ByteLevel" else None)
        self._cache: dict[int, tuple[str, bytes]] = {}

    def get(self, token: int) -> tuple[str, bytes]:
        found = self._cache.get(token)
        if found is None:
            raw = self._bytes(token)
            found = self._cache[token] = (raw.decode("utf-8", errors="replace"), raw)
        return found

    def _bytes(self, token: int) -> bytes:
        if self._byte_of is not None:
            piece = self.tokenizer.hf.convert_ids_to_tokens(token)
            if isinstance(piece, str) and piece and all(ch in self._byte_of for ch in piece):
                return bytes(self._byte_of[ch] for ch in piece)
        return self.tokenizer.decode([token]).encode("utf-8")


def chat_logprobs(entries: Sequence[TokenLogprob], texts: TokenTexts) -> dict[str, Any]:
    def one(token: int, logprob: float) -> dict[str, Any]:
        text, raw = texts.get(token)
        return {"token": text, "logprob": logprob, "bytes": list(raw)}

    return {"content": [{**one(e.token_id, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}
                        for e in entries]}


class TextLogprobs:
    """One /v1/completions choice's logprobs, piece by piece; text_offset runs on across pieces."""

    def __init__(self, texts: TokenTexts) -> None:
        self.texts = texts
        self.offset = 0

    def piece(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        tokens, offsets = [], []
        for e in entries:
            text = self.texts.get(e.token_id)[0]
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(text)
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{self.texts.get(t)[0]: lp for t, lp in e.top} for e in entries],
                "text_offset": offsets}
