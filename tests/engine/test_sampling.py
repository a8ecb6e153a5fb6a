"""Stochastic requests: a seed fixes the output whatever shares the batch; grammars still hold."""
from __future__ import annotations

import json


from interlock.engine import Engine
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import SamplingParams

from helpers import SCHEMA, assert_all_free, config, seeded_alone_and_batched, wait_idle

async def test_same_seed_same_output_alone_or_in_a_batch_of_8(tiny) -> None:
    alone, batched = await seeded_alone_and_batched(tiny, config(1).speculative)
    assert batched == alone
    assert len(set(alone)) > 1                  # the seeds matter: not all the same draw


async def test_stochastic_constrained_outputs_are_valid_json(tiny) -> None:
    import jsonschema

    async with Engine(tiny, config(4)) as engine:
        for seed in range(6):
            c = await engine.complete("JSON please", grammar=JsonSchema(SCHEMA),
                                      sampling=SamplingParams(temperature=1.0, seed=seed, max_tokens=64))
            if c.finish_reason == "stop":
                jsonschema.validate(json.loads(c.text), SCHEMA)
            else:
                assert c.finish_reason == "length"


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
