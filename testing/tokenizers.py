"""A small byte-level BPE tokenizer for fast grammar tests.

256 byte tokens (id = byte value), one token per merge in `pieces` order, then EOS. Grammar
backends build their token tables in time linear in the vocabulary, so a ~300-token vocabulary
makes compiling and mask filling cheap, while multi-byte tokens (`{"`, `true`, ` "`) still exercise
what token-level matching gets wrong: a token that crosses a grammar boundary, or a UTF-8 character
split over byte tokens.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from interlock.models.tokenizer import Tokenizer

EOS = "<|end|>"
# Text pieces turned into merges (each prefix becomes a token too): JSON punctuation and literals,
# common key and word starts, and whitespace runs.
DEFAULT_PIECES: tuple[str, ...] = (
    '{"', '":', '",', '"}', '":"', '","', ' "', '": ', ', "', '[]', '{}', '},', '],',
    "true", "false", "null", "name", "type", "value", "id", "the", " the", "ing", "er",
    "  ", "    ", "\n", "\n  ", "00", "12",
)


def byte_level_alphabet() -> list[str]:
    """The printable stand-in character for each byte 0..255 (the GPT-2 byte-level convention).

    Printable Latin-1 bytes stand for themselves; the others are shifted to 256+ so that every
    token is a string of visible characters (space is 'Ġ', newline 'Ċ').
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    shifted = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(shifted)) for b in range(256)]


MARKERS: tuple[str, ...] = ("<think>", "</think>", "<tool_call>", "</tool_call>")


def byte_tokenizer(pieces: Sequence[str] = DEFAULT_PIECES, special: Sequence[str] = ()) -> Tokenizer:
    """A byte-level BPE `Tokenizer`: 256 byte ids, a token per merge needed for `pieces`, then EOS,
    then one special token per `special` string (e.g. `MARKERS`, for switching grammars).

    Any text encodes (every byte is a token). Vocabulary size is 256 + merges + 1 + len(special),
    about 300 for the defaults; `eos_token_ids` is the id right after the merges.
    """
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = byte_level_alphabet()
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges = _merges(pieces, alphabet, vocab)
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=merges))
    # No regex split: pieces such as '":' or ', "' cross the word boundaries GPT-2's regex draws.
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens([EOS, *special])
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=EOS)
    key = "bytes-" + hashlib.sha256(json.dumps([list(pieces), list(special)]).encode()).hexdigest()[:16]
    return Tokenizer(hf=hf, key=key, eos_token_ids=(hf.eos_token_id,))


def _merges(pieces: Sequence[str], alphabet: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Left-to-right merges building each piece; adds every new token to `vocab` in order."""
    merges: list[tuple[str, str]] = []
    for piece in pieces:
        symbols = [alphabet[b] for b in piece.encode("utf-8")]
        built = symbols[0]
        for symbol in symbols[1:]:
            merged = built + symbol
            if merged not in vocab:
                vocab[merged] = len(vocab)
                merges.append((built, symbol))
            built = merged
    return merges
