"""Stochastic requests: a seed fixes the output whatever shares the batch; grammars still hold."""
from __future__ import annotations

import json

import anyio

from interlock.engine import Engine
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import SamplingParams

from helpers import SCHEMA, config, wait_idle, assert_all_free

SEEDED = [SamplingParams(temperature=0.9, top_p=0.95, seed=s, max_tokens=24) for s in (1, 2, 3)]


async def test_same_seed_same_output_alone_or_in_a_batch_of_8(tiny) -> None:
    async with Engine(tiny, config(1)) as engine:
        alone = [(await engine.complete("Once upon a time", grammar=JsonSchema(SCHEMA), sampling=p)).token_ids
                 for p in SEEDED]
    async with Engine(tiny, config(8)) as engine:
        batched: dict[int, tuple[int, ...]] = {}

        async def seeded(i: int) -> None:
            c = await engine.complete("Once upon a time", grammar=JsonSchema(SCHEMA), sampling=SEEDED[i])
            batched[i] = c.token_ids

        async def noise(i: int) -> None:        # unseeded, different lengths: other uses of the batch
            await engine.complete(f"Noise {i}", sampling=SamplingParams(temperature=1.0, max_tokens=5 + 3 * i))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(seeded, i)
                for i in range(5):
                    tg.start_soon(noise, i)
        await wait_idle(engine)
        await assert_all_free(engine)
    assert [batched[i] for i in range(3)] == alone
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
