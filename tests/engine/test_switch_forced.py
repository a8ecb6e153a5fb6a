"""Forced drafts across the switch on a real workload (SmolLM2, few-shot prompts that write a sentence
and then a tool call `CALL:{json}` ended by a newline).

The model writes the trigger as " C" "ALL" ":" (the space joins the first token) while the tokenizer
spells "CALL:" alone as "C" "ALL" ":": a trigger matched on token ids never fired here, so the JSON
ran unconstrained and the forced drafter drafted nothing (benchmarks/results/switch-2026-11-23.json,
acceptance length 1.00). Triggers are matched on the tokens' bytes now (grammars/triggers.py).
"""
from __future__ import annotations

import pytest

from interlock.grammars import make_backend
from interlock.grammars.validate import validate_output, validate_segments
from interlock.protocol.grammar import JsonSchema, StructuralTag, Tag
from interlock.protocol.sampling import SamplingParams

from helpers import complete_switch

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 14}},
          "required": ["city", "days"]}
SPEC = StructuralTag(["CALL:"], [Tag("CALL:", JsonSchema(SCHEMA), "\n")], at_most=1)
SHOTS = ("Q: Will it rain in Oslo this week?\nA: Let me check the forecast for Oslo. CALL:{\"city\":\"Oslo\",\"days\":7}\n\n"
         "Q: Is Rome warm tomorrow?\nA: I will look up tomorrow in Rome. CALL:{\"city\":\"Rome\",\"days\":1}\n\n")
PROMPT = SHOTS + "Q: Will it snow in Denver this weekend?\nA:"
GREEDY = SamplingParams(temperature=0.0, max_tokens=40)


async def complete(smollm, mode: str | None, backend: str):
    return await complete_switch(smollm, PROMPT, SPEC, mode, backend, GREEDY, draft_len=4, max_batch_size=1)


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
async def test_forced_drafts_resume_after_a_trigger_spelled_in_context(smollm, backend):
    tok = smollm.tokenizer
    assert tok.encode(" CALL:")[:1] != tok.encode("CALL:")[:1]          # the premise: spelled otherwise
    plain = await complete(smollm, None, backend)
    assert " CALL:{" in plain.text and plain.finish_reason == "stop", plain.text
    validate_output(SPEC, plain.text)
    b = make_backend(backend, tok, smollm.config.vocab_size)
    m = b.matcher(b.compile(SPEC))
    assert m.accept(list(plain.token_ids)) and m.phase == "done"     # (the output's ids hold no EOS)
    segs = m.segments()                                     # the grammar switched, and the call is its part
    assert [s.kind for s in segs] == ["free", "marker", "constrained", "marker"], segs
    validate_segments(segs, tok.decode)
    forced = await complete(smollm, "forced", backend)
    assert forced.token_ids == plain.token_ids
    assert forced.stats.drafted > 0 and forced.stats.accepted == forced.stats.drafted   # forced: always right
    both = await complete(smollm, "ngram+forced", backend)
    assert both.token_ids == plain.token_ids and both.stats.drafted > 0
