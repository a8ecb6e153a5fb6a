"""grammars/llguidance_calls.py: the same masks and consumes as llguidance.torch's functions, and the
grammar modules never import llguidance.torch (its torch.compile decorator costs ~3 s of every start)."""
from __future__ import annotations

import subprocess
import sys

import llguidance
import llguidance.torch
import torch

from interlock.grammars import llguidance_calls

SCHEMA = '{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}'


def matchers(backend, n: int) -> list:
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    return [llguidance.LLMatcher(backend._tok, grammar, log_level=0) for _ in range(n)]


def test_the_calls_fill_and_consume_as_llguidance_torch_does(tiny_backends, tiny_tokenizer):
    backend = tiny_backends["llguidance"]
    V = backend.vocab_size
    ours, theirs = matchers(backend, 2), matchers(backend, 2)
    executor = llguidance.LLExecutor()
    prefix = tiny_tokenizer.encode('{"name":"')
    assert llguidance_calls.consume_token_par(executor, [(m, prefix[0]) for m in ours]) == \
        llguidance.torch.consume_token_par(executor, [(m, prefix[0]) for m in theirs]) == [True, True]
    a, b = (llguidance.torch.allocate_token_bitmask(2, V) for _ in range(2))
    llguidance_calls.fill_next_token_bitmask(ours[0], a, 1)
    llguidance.torch.fill_next_token_bitmask(theirs[0], b, 1)
    assert torch.equal(a, b)
    llguidance_calls.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(ours)], a)
    llguidance.torch.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(theirs)], b)
    assert torch.equal(a, b)
    drafts = prefix[1:3]
    a, b = (llguidance.torch.allocate_token_bitmask(len(drafts) + 1, V) for _ in range(2))
    llguidance_calls.fill_next_token_bitmask_par_with_draft_tokens(executor, [(ours[0], 0, drafts)], a)
    llguidance.torch.fill_next_token_bitmask_par_with_draft_tokens(executor, [(theirs[0], 0, drafts)], b)
    assert torch.equal(a, b)


def test_the_grammar_modules_do_not_import_llguidance_torch():
    code = ("import sys, interlock.grammars.backends, interlock.grammars.batch, interlock.actors.grammar_layer; "
            "print('llguidance.torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
