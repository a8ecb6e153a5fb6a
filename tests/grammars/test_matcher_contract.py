"""The matcher contract on both backends: all-or-nothing accept, rollback, EOS, vocabulary bounds."""
from __future__ import annotations

import pytest
import torch

from interlock.grammars import allowed_ids
from interlock.grammars.bitmask import words_for
from interlock.models.loader import TINY_PADDED_VOCAB
from interlock.protocol.grammar import Choice, Ebnf, JsonSchema, Regex

V = TINY_PADDED_VOCAB
SCHEMA = JsonSchema({"type": "object", "properties": {"n": {"type": "integer"}, "name": {"type": "string"}},
                     "required": ["n", "name"], "additionalProperties": False})
DOC = '{"n":12,"name":"héllo wörld"}'     # properties in the order the schema declares them
NAMES = ("xgrammar", "llguidance", "auto")


@pytest.fixture(params=NAMES)
def setup(request, tiny_backends, tiny_tokenizer):
    backend = tiny_backends[request.param]
    return backend, backend.matcher(backend.compile(SCHEMA)), tiny_tokenizer


def mask_of(backend, matcher) -> list[int]:
    mask = backend.allocate_bitmask(1)
    matcher.fill_mask(mask, 0)
    return allowed_ids(mask, 0, V)


def test_accepts_document_then_eos_then_nothing(setup):
    backend, m, tok = setup
    ids = tok.encode(DOC)
    eos = tok.eos_token_ids[0]
    assert not m.is_accepting() and eos not in mask_of(backend, m)
    assert m.accept(ids)
    assert m.is_accepting() and not m.is_terminated()
    assert eos in mask_of(backend, m)
    assert m.accept([eos]) and m.is_terminated()
    assert mask_of(backend, m) == []
    assert not m.accept([eos]) and m.validate([eos, 5]) == 0
    assert m.num_accepted == len(ids) + 1


def test_eos_refused_before_the_grammar_accepts(setup):
    backend, m, tok = setup
    ids = tok.encode(DOC)
    assert m.accept(ids[:-1])
    assert not m.accept([tok.eos_token_ids[0]])
    assert m.validate([ids[-1], tok.eos_token_ids[0], ids[0]]) == 2     # nothing follows EOS


def test_refused_multi_token_accept_leaves_state_intact(setup):
    backend, m, tok = setup
    ids = tok.encode(DOC)
    assert m.accept(ids[:3])
    before = mask_of(backend, m)
    bad = ids[3:8] + tok.encode("}}")                # fails after several good tokens
    assert m.validate(bad) == 5
    assert not m.accept(bad)
    assert m.num_accepted == 3 and mask_of(backend, m) == before
    assert m.accept(ids[3:]) and m.is_accepting()


def test_multibyte_token_failing_midway(setup):
    backend, m, tok = setup
    # "é" is several bytes; in a number position no byte of it is allowed, and nothing changes.
    prefix = tok.encode('{"n":')
    assert m.accept(prefix)
    before = mask_of(backend, m)
    assert not m.accept(tok.encode("é"))
    assert mask_of(backend, m) == before and m.num_accepted == len(prefix)


def test_out_of_vocabulary_ids_refused(setup):
    backend, m, tok = setup
    for bad in (-1, tok.vocab_size, V - 1, V, 10**9):
        assert m.validate([bad]) == 0
        assert not m.accept([bad])
    assert m.num_accepted == 0
    mask = backend.allocate_bitmask(2)
    m.fill_mask(mask, 1)
    assert mask.shape == (2, words_for(V))
    assert all(t < tok.vocab_size for t in allowed_ids(mask, 1, V))


def test_rollback_zero_and_past_history(setup):
    backend, m, tok = setup
    ids = tok.encode(DOC)
    m.rollback(0)
    with pytest.raises(ValueError, match="cannot roll back 1"):
        m.rollback(1)
    assert m.accept(ids[:4])
    with pytest.raises(ValueError):
        m.rollback(5)
    with pytest.raises(ValueError):
        m.rollback(-1)
    assert m.num_accepted == 4


def test_rollback_across_termination_restores_state(setup):
    backend, m, tok = setup
    ids = tok.encode(DOC)
    eos = tok.eos_token_ids[0]
    assert m.accept(ids[:5])
    mid = mask_of(backend, m)
    assert m.accept(ids[5:] + [eos]) and m.is_terminated()
    m.rollback(1)
    assert not m.is_terminated() and m.is_accepting() and eos in mask_of(backend, m)
    m.rollback(len(ids) - 5)
    assert mask_of(backend, m) == mid
    m.reset()
    assert m.num_accepted == 0 and mask_of(backend, m) == mask_of(backend, backend.matcher(backend.compile(SCHEMA)))


def test_fill_masks_rows_match_step_by_step(setup):
    backend, m, tok = setup
    ids = tok.encode(DOC) + [tok.eos_token_ids[0]]
    drafts = ids[:6] + tok.encode("]") + ids[6:]     # refused at index 6
    mask = backend.allocate_bitmask(len(drafts) + 2)
    rows = m.fill_masks(mask, 1, drafts)
    assert rows == 7 and m.num_accepted == 0
    ref = backend.matcher(backend.compile(SCHEMA))
    for j in range(rows):
        assert allowed_ids(mask, 1 + j, V) == mask_of(backend, ref)
        ref.accept([drafts[j]])
    with pytest.raises(ValueError):
        m.fill_masks(backend.allocate_bitmask(2), 0, drafts)        # not enough rows
    with pytest.raises(ValueError):
        m.fill_mask(torch.zeros(1, words_for(V), dtype=torch.int64))


def test_forced_tokens_are_accepted_and_free(setup):
    backend, m, tok = setup
    forced = m.forced_tokens()
    assert forced and tok.decode(forced).startswith('{"')
    assert m.validate(forced) == len(forced) and m.num_accepted == 0


@pytest.mark.parametrize("name", NAMES)
def test_other_spec_kinds(name, tiny_backends, tiny_tokenizer):
    backend, tok = tiny_backends[name], tiny_tokenizer
    eos = tok.eos_token_ids[0]
    cases = [(Regex(r"[a-z]+@example\.com"), "joe@example.com", "joe@example.org"),
             (Ebnf('root ::= "yes" | "no" " thanks"?'), "no thanks", "nope"),
             (Choice(["red", "green", 'a "quoted" one']), 'a "quoted" one', "blue")]
    for spec, good, bad in cases:
        m = backend.matcher(backend.compile(spec))
        assert m.accept(tok.encode(good) + [eos]), (name, spec)
        m.reset()
        assert m.validate(tok.encode(bad) + [eos]) < len(tok.encode(bad)) + 1, (name, spec)


@pytest.mark.parametrize("name", NAMES)
def test_a_mask_at_a_dead_end_is_empty_and_rolls_back(name, tiny_backends, tiny_tokenizer):
    # "0" then "\x06", which no token of the tiny vocabulary spells: the state after "0" is a dead
    # end. llguidance stops with an error when it computes that mask and then refused rollback,
    # which took the engine's grammar lane down when a forced "0" was verified (found by the
    # public-API fuzz test).
    backend = tiny_backends[name]
    m = backend.matcher(backend.compile(Choice(["0\x06"])))
    zero = tiny_tokenizer.encode("0")
    assert m.forced_tokens() == zero
    mask = backend.allocate_bitmask(3)
    assert m.fill_masks(mask, 0, zero) == 2                 # state unchanged afterwards
    assert allowed_ids(mask, 0, V) == zero and allowed_ids(mask, 1, V) == []
    assert m.num_accepted == 0 and mask_of(backend, m) == zero
    assert m.accept(zero) and mask_of(backend, m) == [] and m.validate(zero) == 0
    m.rollback(1)
    assert m.num_accepted == 0 and mask_of(backend, m) == zero and m.accept(zero)
