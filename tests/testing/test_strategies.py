"""The strategies draw only what they promise, judged by a fresh backend matcher (not the walker)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from interlock.protocol.grammar import Ebnf, JsonSchema, Regex
from interlock.testing import (Accept, Rollback, TokenMix, Tokens, allowed_sequences, grammar_case, operations,
                               refused_sequences, run_operations)

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string"}, "ok": {"type": "boolean"},
                         "n": {"type": "integer"}, "kind": {"enum": ["a", "bc"]}},
          "required": ["name", "ok"]}
SPECS = {
    "json": JsonSchema(SCHEMA, whitespace="flexible"),
    "ebnf": Ebnf('root ::= item ("," item)*\nitem ::= [a-z]+ | "(" root ")"'),
    "regex": Regex(r"(\+?[0-9]{1,3} )?[0-9]{3}-[0-9]{4}"),
}
FAST = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


def fresh_judge(case):
    """A matcher from the backend itself, independent of the case's factory and of the walk."""
    return case.backend.matcher(case.compiled)


@pytest.fixture(params=["xgrammar", "llguidance"])
def backend_name(request):
    return request.param


@pytest.fixture(params=["bytes", "tiny"])
def backends(request, byte_backends, tiny_backends):
    return byte_backends if request.param == "bytes" else tiny_backends


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_allowed_sequences_are_accepted_by_a_fresh_matcher(spec, backends, backend_name):
    case = grammar_case(spec, backends[backend_name])

    @FAST
    @given(allowed_sequences(case, min_size=1, max_size=12))
    def check(tokens: Tokens) -> None:
        assert 1 <= len(tokens) <= 12
        judge = fresh_judge(case)
        assert judge.validate(list(tokens.ids)) == len(tokens)
        assert judge.accept(list(tokens.ids))
        assert tokens.text == case.tokenizer.decode(list(tokens.ids))

    check()


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_refused_sequences_are_refused_exactly_at_the_last_token(spec, backends, backend_name):
    case = grammar_case(spec, backends[backend_name])

    @FAST
    @given(refused_sequences(case, max_prefix=10))
    def check(refused) -> None:
        judge = fresh_judge(case)
        assert judge.validate(list(refused.ids)) == len(refused.prefix)
        assert judge.accept(list(refused.prefix.ids))
        assert not judge.accept([refused.token])
        assert judge.num_accepted == len(refused.prefix)
        assert 0 <= refused.token < case.vocab_size

    check()


def test_refused_without_padding_stays_in_the_tokenizer(tiny_backends):
    case = grammar_case(SPECS["ebnf"], tiny_backends["xgrammar"])
    assert case.vocab_size > case.tokenizer.vocab_size

    @FAST
    @given(refused_sequences(case, include_padding=False))
    def check(refused) -> None:
        assert refused.token < case.tokenizer.vocab_size
        assert not fresh_judge(case).accept(list(refused.ids))

    check()


def test_length_bounds_hold_when_the_grammar_never_ends(byte_backends, backend_name):
    case = grammar_case(Regex("[a-z]+"), byte_backends[backend_name])

    @FAST
    @given(allowed_sequences(case, min_size=3, max_size=6))
    def check(tokens: Tokens) -> None:
        assert 3 <= len(tokens) <= 6

    check()


def test_mix_without_eos_never_ends_and_frequent_only_stays_ascii(byte_backends):
    case = grammar_case(SPECS["json"], byte_backends["llguidance"])
    eos = set(case.tokenizer.eos_token_ids)

    @FAST
    @given(allowed_sequences(case, max_size=20, mix=TokenMix(frequent=1, forced=0, any=0, rare=0, eos=0)))
    def check(tokens: Tokens) -> None:
        assert not eos & set(tokens.ids)
        assert all(case.text([t]).isascii() and case.text([t]).isprintable() or case.text([t]) in "\n\t"
                   for t in tokens.ids), tokens

    check()


def test_forced_only_follows_the_forced_tokens(byte_backends, backend_name):
    """A grammar with one sentence: following forced tokens must spell it exactly."""
    case = grammar_case(Regex("interlock"), byte_backends[backend_name])

    @FAST
    @given(allowed_sequences(case, min_size=30, max_size=30, mix=TokenMix(frequent=0, forced=1, any=0, rare=0, eos=1)))
    def check(tokens: Tokens) -> None:
        assert tokens.text == "interlock" + "<|end|>"

    check()


@pytest.mark.parametrize("kwargs", [{"frequent": -1},
                                    {"frequent": 0, "forced": 0, "any": 0, "rare": 0, "eos": 0, "marker": 0},
                                    {"share": 0.0}])
def test_token_mix_rejects_bad_weights(kwargs):
    with pytest.raises(ValueError):
        TokenMix(**kwargs)


def test_operations_are_valid_where_drawn_and_pass_on_real_matchers(byte_backends, backend_name):
    case = grammar_case(SPECS["json"], byte_backends[backend_name])

    @FAST
    @given(operations(case, max_ops=15))
    def check(ops) -> None:
        depth = 0
        for op in ops:
            if isinstance(op, Rollback):
                assert 0 <= op.n <= depth
                depth -= op.n
            depth += isinstance(op, Accept)
        harness = run_operations(case, ops)
        assert len(harness.accepted) == depth
        assert list(harness.history) == list(ops)

    check()


def test_tokens_print_as_text_and_ids(byte_backends):
    case = grammar_case(SPECS["json"], byte_backends["xgrammar"])
    ids = case.tokenizer.encode('{"name":"é"')
    text = repr(case.tokens(ids))
    assert repr('{"name":"é"') in text and str(ids) in text
    assert case.text([5, case.vocab_size + 3]) == case.tokenizer.decode([5]) + f"<{case.vocab_size + 3}>"
