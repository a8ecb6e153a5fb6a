"""JSON never holds a raw control character in a string; xgrammar's grammar would allow one
(a tab byte inside "..."), so its JSON matchers filter such tokens (grammars/xgrammar_backend.py)."""
from __future__ import annotations

import pytest

from interlock.grammars import make_backend
from interlock.grammars.bitmask import allowed_ids
from interlock.grammars.validate import validate_output
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import JsonObject, JsonSchema, Regex
from interlock.testing import byte_tokenizer

# maxLength matters: xgrammar 0.2.9 takes a raw tab in a string with a length bound (its plain
# string rule refuses one).
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def backends(tok):
    return {n: make_backend(n, tok, tok.vocab_size) for n in ("xgrammar", "llguidance", "auto")}


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "auto"])
@pytest.mark.parametrize("spec", [JsonSchema(SCHEMA), JsonSchema(SCHEMA, whitespace="flexible"), JsonObject()],
                         ids=["compact", "flexible", "object"])
def test_no_raw_tab_inside_a_string(backend, spec, backends, tok):
    m = backends[backend].matcher(backends[backend].compile(spec))
    assert m.accept(tok.encode('{"city":"a'))
    tab = tok.encode("\t")
    assert len(tab) == 1
    mask = backends[backend].allocate_bitmask(1)
    m.fill_mask(mask, 0)
    if backend == "xgrammar" and spec == JsonSchema(SCHEMA, whitespace="flexible"):
        # Known and documented (LENIENCY.md): flexible whitespace must allow tabs between tokens and
        # xgrammar's mask cannot tell a string apart; the end-of-request check refuses the document.
        assert tab[0] in allowed_ids(mask, 0, tok.vocab_size) and m.accept(tab)
        return
    assert tab[0] not in allowed_ids(mask, 0, tok.vocab_size)
    assert not m.accept(tab)
    if backend != "xgrammar":     # xgrammar refuses every escape in a length-bounded string (LENIENCY.md)
        assert m.accept(tok.encode('\\tb"}'))              # the escaped tab is fine


def test_the_raw_tab_document_fails_the_end_check():
    with pytest.raises(GrammarError, match="not valid JSON"):
        validate_output(JsonSchema(SCHEMA), '{"city":"a\tb"}')


def test_flexible_whitespace_still_allows_tabs_between_tokens(backends, tok):
    m = backends["xgrammar"].matcher(backends["xgrammar"].compile(JsonSchema(SCHEMA, whitespace="flexible")))
    assert m.accept(tok.encode('{\t"city":\n"x"\r\n}')) and m.is_accepting()


def test_non_json_grammars_keep_control_characters(backends, tok):
    m = backends["xgrammar"].matcher(backends["xgrammar"].compile(Regex("a\tb")))
    assert m.accept(tok.encode("a\tb")) and m.is_accepting()


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "bytes"])
def test_the_filter_from_token_bytes_bans_what_the_decoded_text_holds(name, tok):
    """ControlFilter reads each token's bytes; the slow reference decodes every token to text (what it
    did before) and bans the same ids, under both whitespace modes."""
    from interlock.grammars.xgrammar_backend import ControlFilter, XGrammarBackend
    from interlock.models.loader import load_tokenizer

    real = tok if name == "bytes" else load_tokenizer(name)
    backend = XGrammarBackend(real, real.vocab_size)
    texts = real.hf.batch_decode([[i] for i in range(real.vocab_size)])
    built = ControlFilter.build_both(backend.token_bytes, real.vocab_size)
    for flexible, allowed in ((False, set()), (True, {"\t", "\n", "\r"})):
        expected = {i for i, text in enumerate(texts) if {c for c in text if ord(c) < 0x20} - allowed}
        assert built[flexible].banned == expected
    assert built[False].banned                      # the vocabulary has some: the check is not vacuous
