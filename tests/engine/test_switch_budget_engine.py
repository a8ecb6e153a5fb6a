"""Reasoning.max_reasoning_tokens under speculation, through the engine: the thinking is the
unconstrained output's first tokens, the end marker follows exactly at the limit, every drafter
gives the plain greedy output token for token (n-gram drafts from the repetitive prompt run past the
limit and are cut there), and the forced drafter drafts the marker at the limit (only "forced" runs
draft nothing else, so its accepted count is the marker's tokens at least)."""
from __future__ import annotations

import pytest

from interlock.grammars.validate import validate_output
from interlock.protocol.grammar import JsonSchema, Reasoning
from interlock.protocol.sampling import SamplingParams

from helpers import SWITCH_PROMPT, SWITCH_SCHEMA, complete_switch

SCHEMA = SWITCH_SCHEMA
GREEDY = SamplingParams(temperature=0.0, max_tokens=30)


async def run(tiny, spec, mode: str | None, backend: str = "llguidance"):
    return await complete_switch(tiny, SWITCH_PROMPT, spec, mode, backend, GREEDY, max_batch_size=1)


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("budget", [0, 3])
async def test_budget_under_speculation(tiny, budget, backend):
    tok = tiny.tokenizer
    end = tok.encode("</think>")
    free = await run(tiny, None, None, backend)
    spec = Reasoning(then=JsonSchema(SCHEMA), max_reasoning_tokens=budget)
    plain = await run(tiny, spec, None, backend)
    ids = list(plain.token_ids)
    assert ids[:budget] == list(free.token_ids)[:budget]            # thinking is the model's own
    assert ids[budget:budget + len(end)] == end                      # the marker, exactly at the limit
    assert plain.finish_reason == "stop"
    validate_output(JsonSchema(SCHEMA), tok.decode(ids[budget + len(end):]))
    for mode in ["ngram", "forced", "ngram+forced", "self-draft+forced"]:
        got = await run(tiny, spec, mode, backend)
        assert got.token_ids == plain.token_ids, mode
        if mode == "forced":
            # The marker is drafted at the limit and, being the only tokens allowed, accepted. (The
            # answer's jump-forward text may be drafted in a tokenization the model does not pick.)
            assert got.stats.accepted >= len(end)
