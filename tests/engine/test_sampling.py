"""Stochastic requests: a seed fixes the output whatever shares the batch; grammars still hold."""
from __future__ import annotations

import json


from interlock.engine import Engine
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import SamplingParams

from helpers import assert_all_free, config, seeded_alone_and_batched, wait_idle

async def test_same_seed_same_output_alone_or_in_a_batch_of_8(tiny) -> None:
    alone, batched = await seeded_alone_and_batched(tiny, config(1).speculative)
    assert batched == alone
    assert len(set(alone)) > 1                  # the seeds matter: not all the same draw


# Every value bounded (enums, a boolean, a short integer range): a document always completes well
# within max_tokens, so the test sees complete outputs, and says how many.
BOUNDED = {"type": "object", "properties": {"name": {"enum": ["ann", "bob", "cy"]}, "ok": {"type": "boolean"},
                                            "n": {"type": "integer", "minimum": 0, "maximum": 9}},
           "required": ["name", "ok", "n"], "additionalProperties": False}


async def test_stochastic_constrained_outputs_are_complete_valid_json(tiny) -> None:
    import jsonschema

    async with Engine(tiny, config(4)) as engine:
        outputs = [await engine.complete("JSON please", grammar=JsonSchema(BOUNDED),
                                         sampling=SamplingParams(temperature=1.0, seed=seed, max_tokens=64))
                   for seed in range(6)]
    assert [c.finish_reason for c in outputs] == ["stop"] * 6
    for c in outputs:
        jsonschema.validate(json.loads(c.text), BOUNDED)
    assert len({c.text for c in outputs}) > 1               # sampled, not one fixed document


async def test_stop_string_ends_the_output_before_it(tiny) -> None:
    from interlock.protocol.sampling import SamplingParams as SP

    async with Engine(tiny, config(2)) as engine:
        full = await engine.complete("Once upon a time", sampling=SP(max_tokens=40, ignore_eos=True))
        stop = full.text[len(full.text) // 2: len(full.text) // 2 + 3]
        assert stop.strip() and len(full.text) > 10
        cut = await engine.complete("Once upon a time", sampling=SP(max_tokens=40, ignore_eos=True, stop=(stop,)))
        await wait_idle(engine)
        await assert_all_free(engine)
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.find(stop)]
