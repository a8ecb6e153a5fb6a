"""Requests come and go, fail and get cancelled; the engine keeps going and nothing leaks (tiny preset)."""
from __future__ import annotations

import random
import threading
from contextlib import aclosing

import anyio
import pytest

from interlock.engine import Engine
from interlock.protocol.errors import EngineClosedError, EngineError, GrammarError
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import SamplingParams

from helpers import aenumerate, alone_outputs, assert_all_free, case, config, wait_idle


async def test_1000_requests_with_random_cancellation(tiny) -> None:
    distinct = 20
    alone = await alone_outputs(tiny, distinct)
    rng = random.Random(1234)
    done: dict[int, tuple[int, ...]] = {}
    async with Engine(tiny, config(32)) as engine:
        limiter = anyio.Semaphore(32)

        async def one(i: int) -> None:
            prompt, grammar, sampling = case(i % distinct)
            cancel_after = rng.choice([None, None, 0, 1, 3])        # deltas to read before leaving
            async with limiter:
                ids: list[int] = []
                async with aclosing(engine.generate(prompt, grammar=grammar, sampling=sampling)) as stream:
                    async for n, delta in aenumerate(stream):
                        if cancel_after is not None and n >= cancel_after:
                            return
                        ids.extend(delta.token_ids)
                done[i] = tuple(ids)

        with anyio.fail_after(600):
            async with anyio.create_task_group() as tg:
                for i in range(1000):
                    tg.start_soon(one, i)
        await wait_idle(engine)
        await assert_all_free(engine)
    assert len(done) > 300
    for i, ids in done.items():
        assert ids == alone[i % distinct], f"request {i} differs from its run alone"


async def test_invalid_grammar_fails_only_its_request(tiny) -> None:
    alone = await alone_outputs(tiny, 8)
    async with Engine(tiny, config(8)) as engine:
        results: dict[int, tuple[int, ...]] = {}
        errors: list[BaseException] = []

        async def good(i: int) -> None:
            prompt, grammar, sampling = case(i)
            results[i] = (await engine.complete(prompt, grammar=grammar, sampling=sampling)).token_ids

        async def bad() -> None:
            try:
                await engine.complete("x", grammar=JsonSchema({"type": "object", "properties": {"a": {"type": "no-such-type"}}}))
            except GrammarError as exc:
                errors.append(exc)

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(good, i)
                tg.start_soon(bad)
        await wait_idle(engine)
        await assert_all_free(engine)
    assert len(errors) == 1 and "not a valid schema at /properties/a/type" in str(errors[0])
    assert results == alone


async def test_shutdown_with_requests_in_flight_ends_them_with_engine_closed(tiny) -> None:
    caught: list[BaseException] = []

    async def consume(engine: Engine, started: anyio.Event) -> None:
        try:
            async for _ in engine.generate("Once upon a time", sampling=SamplingParams(max_tokens=2000, ignore_eos=True)):
                started.set()
        except EngineClosedError as exc:
            caught.append(exc)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            engine = Engine(tiny, config(4))
            await engine.__aenter__()
            events = [anyio.Event() for _ in range(3)]
            for ev in events:
                tg.start_soon(consume, engine, ev)
            for ev in events:
                await ev.wait()
            await engine.aclose()
    assert len(caught) == 3
    with pytest.raises(EngineClosedError):
        await engine.complete("late")


async def test_actor_crash_fails_every_request_and_closes_the_engine(tiny, monkeypatch) -> None:
    caught: list[BaseException] = []
    async with Engine(tiny, config(4)) as engine:
        calls = {"n": 0}
        hidden = type(engine.model.model).final_hidden       # every forward runs it, with or without the head

        def flaky(self, batch, kv, **kw):
            calls["n"] += 1
            if calls["n"] == 6:
                raise RuntimeError("injected forward failure")
            return hidden(self, batch, kv, **kw)

        monkeypatch.setattr(type(engine.model.model), "final_hidden", flaky)

        async def consume() -> None:
            try:
                await engine.complete("Once upon a time", sampling=SamplingParams(max_tokens=200, ignore_eos=True))
            except EngineError as exc:
                caught.append(exc)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(consume)
        with pytest.raises(EngineError):
            await engine.complete("after the crash")
    assert len(caught) == 3 and all("injected" in repr(e.__cause__) or "crashed" in str(e) for e in caught)
    lanes = [t for t in threading.enumerate() if t.name.startswith("interlock-") and t.name.endswith("-lane")]
    assert lanes == []                              # the crashed engine still shut its timeline down


async def test_a_consumer_that_stops_reading_does_not_stall_the_others(tiny) -> None:
    alone = await alone_outputs(tiny, 4)
    async with Engine(tiny, config(4, output_buffer=2)) as engine:
        stalled = engine.generate("Once upon a time", sampling=SamplingParams(max_tokens=500, ignore_eos=True))
        first = await stalled.__anext__()          # then never read again
        assert first.token_ids
        results = {}
        with anyio.fail_after(60):
            for i in range(4):
                prompt, grammar, sampling = case(i)
                results[i] = (await engine.complete(prompt, grammar=grammar, sampling=sampling)).token_ids
        assert results == alone
        res = await engine.resources()
        assert res["requests"] == 1                 # the stalled one is paused, not finished
        await stalled.aclose()
        await wait_idle(engine)
        await assert_all_free(engine)


async def test_kv_pool_is_capped_by_bytes_queues_requests_and_is_released_on_close(tiny) -> None:
    from interlock.models.kv_cache import block_bytes

    per_block = block_bytes(tiny.config, 16)
    engine = Engine(tiny, config(4, kv_cache_bytes=10 * per_block))
    async with engine:
        assert (await engine.resources())["kv_total_blocks"] == 10
        # Each request may need 4 blocks, so 2 run side by side though 4 slots are free; the rest wait.
        done = []

        async def one(i: int) -> None:
            done.append(await engine.complete(PROMPTS_LONG[i % 2], sampling=SamplingParams(max_tokens=24)))

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(one, i)
        assert len(done) == 12 and all(c.stats.output_tokens > 0 for c in done)
        await assert_all_free(engine)
    assert engine._rt.kv.k.numel() == 0 and engine._rt.kv.v.numel() == 0


PROMPTS_LONG = ["word " * 30, "other words here " * 12]


async def test_the_heap_is_frozen_while_an_engine_runs_and_thawed_after(tiny) -> None:
    import gc

    gc.unfreeze()                               # whatever an earlier test left
    async with Engine(tiny, config(1)) as engine:
        assert gc.get_freeze_count() > 0
        prompt, grammar, sampling = case(0)
        await engine.complete(prompt, grammar=grammar, sampling=sampling)
    assert gc.get_freeze_count() == 0
    async with Engine(tiny, config(1, freeze_gc=False)):
        assert gc.get_freeze_count() == 0
