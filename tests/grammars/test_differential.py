"""Differential property tests: after any interleaving of accept / refused accept / rollback /
multi-row fill, a matcher's mask equals a fresh matcher replaying its accepted prefix.

The machine is the public one (`interlock.testing.matcher_machine`). Default profile: 10 examples
per spec x 24 specs = 240 per backend, derandomized (the suite is reproducible). Thorough (run once,
see docs/testing.md): HYPOTHESIS_PROFILE=grammar-thorough -> 50 random examples per spec (1,200 per
backend) x 50 steps.
"""
from __future__ import annotations

import json
import os

import pytest
from bench_data import JSONSCHEMABENCH as DATA
from hypothesis import settings

from interlock.grammars.bitmask import allowed_ids
from interlock.protocol.grammar import Ebnf, JsonSchema, Regex
from interlock.testing import (Accept, OfferRefused, default_settings, grammar_case, matcher_machine,
                               run_operations)

settings.register_profile("grammar-default", default_settings(), max_examples=10, stateful_step_count=20,
                          derandomize=True, database=None)
settings.register_profile("grammar-thorough", default_settings(), max_examples=50, stateful_step_count=50)
PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "grammar-default")
                               if os.environ.get("HYPOTHESIS_PROFILE", "").startswith("grammar-")
                               else "grammar-default")


def specs() -> list:
    rows = [json.loads(line) for line in (DATA / "BFCL_simple.jsonl").read_text().splitlines()]
    out = [pytest.param(JsonSchema(r["schema"], whitespace="flexible" if i % 2 else "compact"), id=r["id"])
           for i, r in enumerate(rows[::17][:20])]
    jme = [json.loads(line) for line in (DATA / "JME.jsonl").read_text().splitlines()]
    out += [pytest.param(JsonSchema(jme[i]["schema"]), id=jme[i]["id"]) for i in (0, 2)]
    out.append(pytest.param(Regex(r"(\+?[0-9]{1,3} )?[0-9]{3}-[0-9]{4}( ext [0-9]+)?"), id="regex-phone"))
    out.append(pytest.param(Ebnf('root ::= item ("," item)*\nitem ::= [a-z]+ | "(" root ")"'), id="ebnf-nested"))
    return out


@pytest.mark.parametrize("name", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("spec", specs())
def test_mask_equals_fresh_replay(name, spec, tiny_backends, tiny_tokenizer):
    machine = matcher_machine(spec, tiny_backends[name], tiny_tokenizer, settings=PROFILE)
    machine.TestCase().runTest()


def test_llguidance_refuses_what_its_mask_refuses():
    """The shrunk counterexample the public machine found (byte-level tokenizer): after `{"` the
    mask offers only the canonical `name` token, not `na`; llguidance's own validate_tokens takes
    `na`, so our matcher narrows it to the mask (grammars/llguidance_backend.py)."""
    case = grammar_case(JsonSchema({"type": "object", "properties": {"name": {"type": "string"}},
                                    "required": ["name"]}), "llguidance")
    ids = case.tokenizer.encode('{"na')
    assert len(ids) == 2 and ids[1] not in case.allowed(case.replay(ids[:1]))
    run_operations(case, [Accept(ids[0], case.text(ids[:1])), OfferRefused(ids[1], case.text(ids[1:]))])


@pytest.mark.parametrize("spec", specs()[:8] + specs()[-2:])
def test_backends_agree_on_masks(spec, tiny_backends, tiny_tokenizer, record_property):
    """Where both compile, along a path of tokens both allow: EOS and accepting agree, and any
    token-level mask difference is recorded (LENIENCY.md: the masks are not bit-identical)."""
    x, l = tiny_backends["xgrammar"], tiny_backends["llguidance"]
    mx, ml = x.matcher(x.compile(spec)), l.matcher(l.compile(spec))
    mask = x.allocate_bitmask(2)
    for _ in range(12):
        mx.fill_mask(mask, 0)
        ml.fill_mask(mask, 1)
        ax, al = allowed_ids(mask, 0, x.vocab_size), allowed_ids(mask, 1, x.vocab_size)
        eos = tiny_tokenizer.eos_token_ids[0]
        assert (eos in ax) == (eos in al) == mx.is_accepting() == ml.is_accepting()
        record_property("only_xgrammar", len(set(ax) - set(al)))
        record_property("only_llguidance", len(set(al) - set(ax)))
        common = sorted(set(ax) & set(al) - set(tiny_tokenizer.eos_token_ids))
        if not common:
            break
        token = common[len(common) // 2]
        assert mx.accept([token]) and ml.accept([token])
