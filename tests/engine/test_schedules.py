"""Random arrival / cancel / slow-consumer schedules (hypothesis) keep the engine's invariants:
requests that are not cancelled produce exactly what they produce alone, and afterwards every
slot, KV block, matcher and n-gram entry is free."""
from __future__ import annotations

from contextlib import aclosing

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from interlock.engine import Engine, EngineConfig
from interlock.protocol.speculative import SpeculativeConfig

from helpers import assert_all_free, case, wait_idle

DISTINCT = 8

# One request: (case index, arrival delay in ms, deltas to read before cancelling or None, ms to sleep per delta)
request = st.tuples(st.integers(0, DISTINCT - 1), st.integers(0, 20), st.none() | st.integers(0, 4),
                    st.sampled_from([0, 0, 0, 5]))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schedule=st.lists(request, min_size=1, max_size=12), batch=st.sampled_from([1, 3, 8]))
def test_random_schedules_keep_invariants(tiny, alone, schedule, batch) -> None:
    async def main() -> None:
        config = EngineConfig(speculative=SpeculativeConfig(("ngram", "forced"), max_draft_len=3),
                              max_batch_size=batch, output_buffer=2)
        done: dict[int, tuple[int, ...]] = {}
        async with Engine(tiny, config) as engine:
            async def one(n: int, i: int, delay: int, cancel_after: int | None, slow: int) -> None:
                await anyio.sleep(delay / 1000)
                prompt, grammar, sampling = case(i)
                ids: list[int] = []
                async with aclosing(engine.generate(prompt, grammar=grammar, sampling=sampling)) as stream:
                    count = 0
                    async for delta in stream:
                        if cancel_after is not None and count >= cancel_after:
                            return
                        count += 1
                        ids.extend(delta.token_ids)
                        await anyio.sleep(slow / 1000)
                done[n] = tuple(ids)

            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    for n, (i, delay, cancel_after, slow) in enumerate(schedule):
                        tg.start_soon(one, n, i, delay, cancel_after, slow)
            await wait_idle(engine)
            await assert_all_free(engine)
        for n, ids in done.items():
            assert ids == alone[schedule[n][0]]

    anyio.run(main)
