"""The vocabulary tables the grammar backends keep on disk (grammars/tables.py): a kept table builds the
very tokenizer tables a fresh build makes (llguidance's tokenizer id by id and mask by mask, xgrammar's
TokenizerInfo in its own serialization), a damaged or missing file is built again, not trusted, and
`auto` builds its xgrammar fallback only when it first needs it."""
from __future__ import annotations

from dataclasses import replace

import llguidance
import llguidance.hf
import llguidance.torch
import pytest
import torch
import xgrammar as xgr

from interlock.grammars import make_backend, tables
from interlock.grammars.llguidance_backend import LLGuidanceBackend, encodes_as_is, ll_tokenizer
from interlock.grammars.xgrammar_backend import XGrammarBackend, tokenizer_info
from interlock.models.loader import TINY_PADDED_VOCAB
from interlock.protocol.grammar import Choice, JsonSchema
from interlock.testing.tokenizers import byte_tokenizer

V = TINY_PADDED_VOCAB                     # > the tiny tokenizer's 1024 ids: the padding ids are kept too
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
          "required": ["name", "n"]}
GRAMMARS = [llguidance.LLMatcher.grammar_from_json_schema('{"type":"object","properties":{"a":{"type":"string"}}}'),
            llguidance.LLMatcher.grammar_from_regex(r"The answer is [0-9]+\.( Done)?"),
            llguidance.grammar_from("choice", '["alpha beta gamma", "alpha delta"]')]   # forced text: tokenized


@pytest.fixture
def tok(tiny_tokenizer, tmp_path):
    """The tiny tokenizer, keeping its tables in a folder of this test's own."""
    return replace(tiny_tokenizer, tables=tmp_path)


def kept_files(tok) -> list:
    return sorted(p for p in tok.tables.iterdir() if p.suffix == ".table")


def test_packed_byte_strings_round_trip():
    items = (b"", b"a", b"\xff<pad>", b"", bytes(range(256)))
    assert tables.unpack_bytes(tables.pack_bytes(items)) == items
    assert tables.unpack_bytes(tables.pack_bytes(())) == ()
    with pytest.raises(ValueError):
        tables.unpack_bytes(tables.pack_bytes(items)[:-1])


def test_a_table_is_kept_and_read_back(tok):
    tables.save(tok, "t", (1, "x"), b"payload")
    assert tables.load(tok, "t", (1, "x")) == b"payload"
    assert tables.load(tok, "t", (2, "x")) is None          # built from something else: another name


@pytest.mark.parametrize("damage", ["flip", "cut", "empty", "gone"])
def test_a_damaged_table_is_not_trusted(tok, damage):
    tables.save(tok, "t", (), b"payload" * 100)
    (path,) = kept_files(tok)
    data = path.read_bytes()
    if damage == "flip":
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    elif damage == "cut":
        path.write_bytes(data[:-10])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.unlink()
    assert tables.load(tok, "t", ()) is None


def test_a_tokenizer_made_in_memory_keeps_nothing():
    tok = byte_tokenizer()
    assert tok.tables is None
    tables.save(tok, "t", (), b"payload")
    assert tables.load(tok, "t", ()) is None


def same_llguidance(a, b, vocab: int) -> None:
    """Two llguidance tokenizers agree on every id, and on masks and forced tokens along a walk."""
    assert (a.vocab_size, a.eos_tokens, a.is_canonical) == (b.vocab_size, b.eos_tokens, b.is_canonical)
    assert all(a.decode_bytes([i]) == b.decode_bytes([i]) and a.is_special_token(i) == b.is_special_token(i)
               for i in range(vocab))
    for grammar in GRAMMARS:
        ms = [llguidance.LLMatcher(t, grammar, log_level=0) for t in (a, b)]
        for _ in range(10):
            masks = [llguidance.torch.allocate_token_bitmask(1, vocab) for _ in ms]
            for m, mask in zip(ms, masks):
                llguidance.torch.fill_next_token_bitmask(m, mask, 0)
            assert torch.equal(masks[0], masks[1])
            forced = [m.compute_ff_tokens() for m in ms]
            assert forced[0] == forced[1]
            allowed = [i for i in range(vocab) if (int(masks[0][0, i // 32]) >> (i % 32)) & 1]
            if not allowed or ms[0].is_stopped():
                break
            step = forced[0][:1] or allowed[len(allowed) // 2:][:1]
            assert all(m.consume_tokens(step) for m in ms)


def test_llguidance_from_the_kept_trie_is_the_tokenizer_built_fresh(tok):
    fresh = llguidance.hf.from_tokenizer(tok.hf, n_vocab=V, eos_token=list(tok.eos_token_ids))
    first, trie = ll_tokenizer(tok, V)           # builds, keeps
    assert trie is not None and len(trie) == V and kept_files(tok)
    again, kept = ll_tokenizer(tok, V)           # from the kept bytes
    assert kept == trie
    same_llguidance(fresh, first, V)
    same_llguidance(fresh, again, V)


def test_llguidance_token_bytes_are_what_it_decodes(tok):
    ll_tokenizer(tok, V)
    backend = LLGuidanceBackend(tok, V)
    assert backend.token_bytes == tuple(backend._tok.decode_bytes([i]) for i in range(tok.vocab_size))


def test_a_damaged_llguidance_table_is_built_again(tok):
    _, trie = ll_tokenizer(tok, V)
    (path,) = kept_files(tok)
    path.write_bytes(path.read_bytes()[:100])
    _, again = ll_tokenizer(tok, V)
    assert again == trie
    assert tables.unpack_bytes(path.read_bytes()[tables.HEADER.size:]) == trie      # and kept again, whole


def test_a_tokenizer_llguidance_reads_its_own_way_keeps_no_trie(tmp_path):
    """llguidance drops a Metaspace pre-tokenizer's prepending: there it tokenizes with its own copy."""
    from tokenizers import pre_tokenizers

    tok = replace(byte_tokenizer(), tables=tmp_path)
    assert encodes_as_is(tok.hf)
    tok.hf.backend_tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    assert not encodes_as_is(tok.hf)
    _, trie = ll_tokenizer(tok, tok.vocab_size)
    assert trie is None and not kept_files(tok)


def test_xgrammar_info_from_the_kept_table_is_the_one_built_fresh(tok):
    fresh = xgr.TokenizerInfo.from_huggingface(tok.hf, vocab_size=V, stop_token_ids=list(tok.eos_token_ids))
    first, first_bytes = tokenizer_info(tok, V)
    again, again_bytes = tokenizer_info(tok, V)
    assert kept_files(tok)
    assert first.serialize_json() == again.serialize_json() == fresh.serialize_json()
    assert first_bytes == again_bytes == tuple(fresh.decoded_vocab[:tok.vocab_size])


def test_a_damaged_xgrammar_table_is_built_again(tok):
    _, token_bytes = tokenizer_info(tok, V)
    (path,) = kept_files(tok)
    path.write_bytes(path.read_bytes()[:-5])
    info, again = tokenizer_info(tok, V)
    assert again == token_bytes and info.vocab_size == V


def test_auto_builds_its_xgrammar_fallback_on_first_use(tok):
    auto = make_backend("auto", tok, V)
    xgrammar = auto._by_name["xgrammar"]
    assert isinstance(xgrammar, XGrammarBackend) and xgrammar._built is None
    auto.compile(Choice(["yes", "no"]))                  # llguidance compiles it: xgrammar still unbuilt
    assert xgrammar._built is None
    compiled = xgrammar.compile(JsonSchema(SCHEMA))
    assert xgrammar._built is not None
    assert xgrammar.matcher(compiled).accept(tok.encode('{"name":"a","n":1}'))
