"""The engine with its target forward on 2 gloo ranks (tensor_parallel=2, the tiny preset).

Greedy output is the same token for token in every speculative mode as without speculation, with
the grammar on and off (the masks are computed once per step in the engine's process, where the
sampler runs); constrained outputs are valid; a rank killed mid-generation fails the requests in
flight with WorkerError, within the step timeout, and leaves no process.
"""
from __future__ import annotations

import json
import os
import re
import signal

import anyio
import pytest
from helpers import GRAMMARS, PROMPTS, SCHEMA, complete_all

from interlock.engine import Engine
from interlock.protocol.errors import EngineError, WorkerError
from interlock.protocol.grammar import Choice, JsonSchema, Regex
from interlock.protocol.sampling import Completion, SamplingParams

# ngram and forced alone are covered by their combination; their own runs are soak (8 s of spawn each)
MODES = [pytest.param("ngram", marks=pytest.mark.soak), pytest.param("forced", marks=pytest.mark.soak),
         "ngram+forced", "self-draft+forced"]
CASES = [(PROMPTS[i % len(PROMPTS)], GRAMMARS[i % len(GRAMMARS)], SamplingParams(max_tokens=16 + i % 5))
         for i in range(8)]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def run_cases(mode: str) -> list[Completion]:
    engine = Engine.from_pretrained("tiny", speculative=mode, draft_len=3, tensor_parallel=2, max_batch_size=8,
                                    tp_step_timeout_s=30.0)
    async with engine:
        pids = engine.model.model.group.pids
        results = await complete_all(engine, CASES, timeout_s=300)
        res = await engine.resources()
        assert res["kv_free_blocks"] == res["kv_total_blocks"] and res["matchers"] == 0
    assert all(gone(pid) for pid in pids)
    return results


def check_valid(grammar: object, completion: Completion) -> None:
    if completion.finish_reason != "stop":
        return
    if isinstance(grammar, JsonSchema):
        value = json.loads(completion.text)
        assert set(SCHEMA["required"]) <= set(value) and isinstance(value["age"], int)
    elif isinstance(grammar, Regex):
        assert re.fullmatch(grammar.pattern, completion.text), completion.text
    elif isinstance(grammar, Choice):
        assert completion.text in grammar.options


@pytest.fixture(scope="module")
def plain() -> list[Completion]:
    return anyio.run(run_cases, "none")


def test_plain_outputs_under_tp_are_valid(plain: list[Completion]) -> None:
    assert len(plain) == len(CASES)
    for (_, grammar, _), completion in zip(CASES, plain):
        check_valid(grammar, completion)
    assert any(c.finish_reason == "stop" for (_, g, _), c in zip(CASES, plain) if g is not None)


@pytest.mark.parametrize("mode", MODES)
def test_speculative_equals_plain_token_for_token_under_tp(plain: list[Completion], mode: str) -> None:
    got = anyio.run(run_cases, mode)
    for (prompt, grammar, _), want, have in zip(CASES, plain, got):
        assert have.token_ids == want.token_ids, f"{mode}: {prompt!r} with {grammar!r}"
        assert have.finish_reason == want.finish_reason
        check_valid(grammar, have)
    assert sum(c.stats.steps for c in got) < sum(c.stats.steps for c in plain)     # it did speculate


async def test_a_killed_rank_fails_the_requests_in_flight_and_leaves_no_process() -> None:
    engine = Engine.from_pretrained("tiny", speculative="ngram+forced", tensor_parallel=2, tp_step_timeout_s=10.0)
    errors: list[BaseException] = []
    async with engine:
        pids = engine.model.model.group.pids
        started = anyio.Event()

        async def one(i: int) -> None:
            try:
                async for _ in engine.generate(PROMPTS[i % len(PROMPTS)], sampling=SamplingParams(max_tokens=4000)):
                    started.set()
            except EngineError as exc:
                errors.append(exc)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(one, i)
                await started.wait()
                os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(EngineError):
            await engine.complete("after", sampling=SamplingParams(max_tokens=4))
    assert len(errors) == 3 and all(isinstance(e, WorkerError) for e in errors), errors
    assert all(gone(pid) for pid in pids)
