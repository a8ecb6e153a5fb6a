"""A soak: many requests on the tiny preset at concurrency 32, mixing valid, invalid-schema,
bad-parameter, cancelled and slow-consumer requests in a seeded random order. The engine stays
up, every good output equals its solo run, every bad one gets its typed error, and every resource
returns to zero. The default run sends SHORT requests; `pytest -m soak` sends LONG (2,000) and
prints its figures."""
from __future__ import annotations

import math
import random
import time
from collections import Counter

import anyio
import pytest

from interlock.engine import Engine
from interlock.protocol.errors import GrammarError, InvalidParameterError
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import SamplingParams

from helpers import assert_all_free, case, config, wait_idle

SHORT, LONG = 160, 2000
KINDS = ["valid", "valid", "valid", "invalid_schema", "bad_parameter", "cancelled", "slow_consumer"]


async def _one(engine: Engine, kind: str, i: int, alone: dict, rng: random.Random) -> str:
    prompt, grammar, sampling = case(i % len(alone))
    want = alone[i % len(alone)]
    if kind == "valid":
        got = await engine.complete(prompt, grammar=grammar, sampling=sampling)
        assert got.token_ids == want, f"request {i}: output differs from its solo run"
        return "ok"
    if kind == "invalid_schema":
        with pytest.raises(GrammarError):
            await engine.complete(prompt, grammar=JsonSchema({"type": "no-such-type", "i": i}), sampling=sampling)
        return "GrammarError"
    if kind == "bad_parameter":
        with pytest.raises(InvalidParameterError):
            await engine.complete(prompt, sampling=SamplingParams(temperature=rng.choice([math.nan, -1.0, math.inf])))
        return "InvalidParameterError"
    if kind == "cancelled":
        stop_after = rng.randrange(3)
        stream = engine.generate(prompt, grammar=grammar, sampling=SamplingParams(max_tokens=64))
        n = 0
        async for _ in stream:
            n += 1
            if n > stop_after:
                break
        await stream.aclose()
        return "cancelled"
    got = []                                    # slow consumer: the stream fills and the request pauses
    async for delta in engine.generate(prompt, grammar=grammar, sampling=sampling):
        got.extend(delta.token_ids)
        await anyio.sleep(0.01)
    assert tuple(got) == want, f"request {i}: slow consumer's output differs from its solo run"
    return "ok"


async def soak(tiny, alone: dict, n: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    plan = [(rng.choice(KINDS), i) for i in range(n)]
    outcomes: Counter[str] = Counter()
    start = time.perf_counter()
    async with Engine(tiny, config(32, output_buffer=2)) as engine:
        limiter = anyio.Semaphore(32)

        async def run(kind: str, i: int) -> None:
            async with limiter:
                outcomes[f"{kind}:{await _one(engine, kind, i, alone, random.Random(i))}"] += 1

        with anyio.fail_after(3600):
            async with anyio.create_task_group() as tg:
                for kind, i in plan:
                    tg.start_soon(run, kind, i)
        await wait_idle(engine)
        await assert_all_free(engine)
        metrics = await engine.metrics()
        last = await engine.complete("still up?", sampling=SamplingParams(max_tokens=4))
    assert last.finish_reason in ("stop", "length")
    assert sum(outcomes.values()) == n
    return {"requests": n, "outcomes": dict(sorted(outcomes.items())), "wall_s": round(time.perf_counter() - start, 1),
            "steps": metrics.steps, "output_tokens": metrics.output_tokens}


async def test_soak_short(tiny, alone) -> None:
    figures = await soak(tiny, alone, SHORT)
    assert all(figures["outcomes"].get(f"{k}:{v}", 0) > 0 for k, v in
               [("valid", "ok"), ("invalid_schema", "GrammarError"), ("bad_parameter", "InvalidParameterError"),
                ("cancelled", "cancelled"), ("slow_consumer", "ok")])


@pytest.mark.soak
async def test_soak_2000(tiny, alone) -> None:
    figures = await soak(tiny, alone, LONG)
    print("soak figures:", figures)
