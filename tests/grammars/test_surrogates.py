"""Pins xgrammar's acceptance of a UTF-8-encoded surrogate inside a JSON string (grammars/LENIENCY.md):
this test fails once xgrammar (or interlock's xgrammar matcher) refuses it, so the leniency note and
the example's allowance can go. llguidance refuses it already."""
from __future__ import annotations

from interlock.grammars.backends import make_backend
from interlock.protocol.grammar import GrammarConfig, JsonSchema
from interlock.testing import byte_tokenizer

SURROGATE = [0xED, 0xBF, 0x80]          # U+DFC0 encoded as UTF-8: not valid UTF-8


def accepts(backend_name: str) -> bool:
    tok = byte_tokenizer()
    backend = make_backend(backend_name, tok, tok.vocab_size, GrammarConfig(backend=backend_name))
    matcher = backend.matcher(backend.compile(JsonSchema({"type": "string"})))
    return matcher.accept(tok.encode('"') + SURROGATE + tok.encode('"'))


def test_xgrammar_takes_an_encoded_surrogate_and_llguidance_does_not():
    assert accepts("xgrammar")
    assert not accepts("llguidance")
