"""Reasoning.max_reasoning_tokens at the matcher: a draft that runs past the budget is cut where the
budget ends (the rows after it stop there), the row at the limit allows only the end marker's next
token, and the forced tokens there are the end marker (then the answer's own forced tokens)."""
from __future__ import annotations

import pytest

from interlock.grammars.bitmask import allocate_bitmask, allowed_ids
from interlock.protocol.grammar import JsonSchema, Reasoning

BACKENDS = ("xgrammar", "llguidance")
ARGS = JsonSchema({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("budget", [0, 1, 3])
def test_a_draft_past_the_budget_is_cut_and_the_marker_forced(budget, backend, tiny_backends, tiny_tokenizer):
    b, tok = tiny_backends[backend], tiny_tokenizer
    m = b.matcher(b.compile(Reasoning(then=ARGS, max_reasoning_tokens=budget)))
    end = tok.encode("</think>")
    drafts = tok.encode(" well well well well well")[:budget + 3]      # runs past the budget
    assert len(drafts) > budget and drafts[budget] != end[0]
    mask = allocate_bitmask(len(drafts) + 1, b.vocab_size)
    free = [None] * (len(drafts) + 1)
    rows = m.fill_masks(mask, 0, drafts, free=free)
    assert rows == budget + 1 and m.num_accepted == 0           # drafts after the limit are cut
    for r in range(budget):                                     # thinking: anything but EOS (an answer is due)
        assert set(allowed_ids(mask, r, b.vocab_size)) == set(range(tok.vocab_size)) - set(tok.eos_token_ids)
    assert allowed_ids(mask, budget, b.vocab_size) == end[:1]  # only the marker at the limit
    assert m.accept(drafts[:budget])
    forced = m.forced_tokens()
    assert forced[:len(end)] == end and tok.decode(forced[len(end):]).startswith('{"')
    with_marker = drafts[:budget] + end + tok.encode('{"a":1}')
    m.rollback(budget)
    mask = allocate_bitmask(len(with_marker) + 1, b.vocab_size)
    assert m.fill_masks(mask, 0, with_marker) == len(with_marker) + 1   # a draft that writes it goes through
