"""The device runner (the CUDA engine's path) keeps every engine law. Each test runs on the CPU,
where the runner computes in float32 with torch reference ops and captures steps on the CPU
timeline, and again on CUDA when a GPU is present (bf16, Triton, CUDA graphs):

- greedy speculative == greedy plain, token for token, for every drafter it runs, in a batch that
  mixes prompt chunks (eager steps) and decode steps (captured buckets), and the same alone;
- constrained outputs validate; switching grammars keep the law across the switch;
- captured programs are replayed for steady decode at batch 1 and 8, and give the eager output;
- a NaN row fails its request alone, cancels and failures leak nothing, prefix caching is exact;
- what it does not run yet (draft models) is refused with a typed error naming it.
The stochastic law on this runner is tests/engine/test_point_mass_stats.py's chi-square; guidance,
penalties and logprobs on it are tests/engine/test_device_features.py.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace

import anyio
import jsonschema
import pytest
import torch

from interlock.engine import Engine, EngineConfig
from interlock.parallel.group import TensorParallelModel
from interlock.protocol.errors import SamplingError, UnsupportedModelError
from interlock.protocol.grammar import JsonSchema, Reasoning
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from helpers import SCHEMA, assert_all_free, case, complete_all, wait_idle
from resources import DEVICE_CONTEXT

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                   reason="needs a CUDA device"))]
# Every drafter runs by default: n-gram and grammar-forced in their combination, suffix, and a user
# drafter ("user": an oracle of the plain output). n-gram and forced alone are soak (`pytest -m soak`):
# two more engines over the same cases, for drafters the combination already runs (as in
# test_tensor_parallel.py).
MODES, SOAK_MODES = ["ngram+forced", "suffix+forced", "user"], ["ngram", "forced"]


class Oracle:
    """A user drafter that proposes the request's own plain output (and junk after a mismatch)."""

    def __init__(self, answers: dict[tuple[int, ...], tuple[int, ...]]) -> None:
        self.answers = answers

    def propose(self, requests, k):
        out = []
        for r in requests:
            for prompt, answer in self.answers.items():
                if tuple(r.tokens[: len(prompt)]) == prompt:
                    done = len(r.tokens) - len(prompt)
                    out.append(list(answer[done: done + k]) or [7] * k)
                    break
            else:
                out.append([])
        return out


def device_config(device: str, mode: str | SpeculativeConfig = "ngram+forced", **kw) -> EngineConfig:
    spec = mode if isinstance(mode, SpeculativeConfig) else SpeculativeConfig.parse(mode, max_draft_len=3)
    return EngineConfig(speculative=spec, runner="device", device=device, max_context=DEVICE_CONTEXT, **kw)


async def run_cases(model, config: EngineConfig, cases) -> list:
    async with Engine(model, config) as engine:
        out = await complete_all(engine, cases, timeout_s=300)
        await wait_idle(engine)
        await assert_all_free(engine)
    return out


async def check_speculative_equals_plain(model, device: str, modes: list[str]) -> None:
    cases = [case(i) for i in range(10)]
    plain = await run_cases(model, device_config(device, "none", max_batch_size=4), cases)
    alone = await run_cases(model, device_config(device, "none", max_batch_size=1), cases[:4])
    assert [c.token_ids for c in alone] == [c.token_ids for c in plain[:4]], "batching changed an output"
    tok = model.tokenizer
    oracle = Oracle({tuple(tok.encode_prompt(p)): c.token_ids for (p, _, _), c in zip(cases, plain)})
    for name in modes:
        mode = SpeculativeConfig(drafters=(), user_drafter=oracle, max_draft_len=3) if name == "user" else name
        got = await run_cases(model, device_config(device, mode, max_batch_size=4), cases)
        for i, (want, have) in enumerate(zip(plain, got)):
            assert have.token_ids == want.token_ids, f"{name} differs on case {i}"
            assert have.finish_reason == want.finish_reason
        assert sum(c.stats.drafted for c in got) > 0, f"{name} did not speculate"
    for (_, grammar, _), c in zip(cases, plain):
        if isinstance(grammar, JsonSchema) and c.finish_reason == "stop":
            jsonschema.validate(json.loads(c.text), SCHEMA)


@pytest.mark.parametrize("device", DEVICES)
async def test_greedy_speculative_equals_greedy_plain_for_every_drafter(tiny_float, device: str) -> None:
    await check_speculative_equals_plain(tiny_float, device, MODES)


@pytest.mark.soak
@pytest.mark.parametrize("device", DEVICES)
async def test_greedy_speculative_equals_greedy_plain_for_n_gram_and_forced_alone(tiny_float, device: str) -> None:
    await check_speculative_equals_plain(tiny_float, device, SOAK_MODES)


@pytest.mark.parametrize("device", DEVICES)
async def test_steady_decode_replays_captured_steps_at_batch_1_and_8(tiny_float, device: str) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    for batch in (1, 8):
        async with Engine(tiny_float, device_config(device, max_batch_size=8)) as engine:
            await complete_all(engine, [(f"Once upon a time {i}", None, greedy) for i in range(batch)], timeout_s=300)
            metrics = await engine.metrics()
        assert metrics.captured_programs >= 1, metrics
        # prompt chunks and each bucket's first step run eagerly; the steady decode replays
        assert metrics.replayed_steps >= metrics.steps - 6, metrics
        assert metrics.replayed_steps + metrics.eager_steps == metrics.steps


@pytest.mark.parametrize("device", DEVICES)
async def test_captured_steps_give_the_eager_output(tiny_float, device: str) -> None:
    cases = [case(i) for i in range(6)]
    captured = await run_cases(tiny_float, device_config(device, max_batch_size=4), cases)
    eager = await run_cases(tiny_float, device_config(device, max_batch_size=4, capture_steps=False), cases)
    assert [c.token_ids for c in captured] == [c.token_ids for c in eager]


@pytest.mark.parametrize("runner", ["host", "device"])
async def test_the_exposed_grammar_time_is_the_model_lanes_wait_for_the_masks(tiny_float, monkeypatch,
                                                                             runner: str) -> None:
    """Planted: a mask fill 200 ms slower than it is, far longer than the tiny forward of a steady
    (replayed) decode step. The model lane waits for it, and both runners' metric says so (the
    device runner's read 0 before: its verification's Python runs at enqueue, so the host runner's
    clock in `verify` saw nothing)."""
    from interlock.actors.grammar_actor import GrammarActor

    fill = GrammarActor.fill

    def slow(self) -> None:
        time.sleep(0.2)
        fill(self)

    monkeypatch.setattr(GrammarActor, "fill", slow)
    config = device_config("cpu", max_batch_size=2) if runner == "device" else \
        EngineConfig(speculative=SpeculativeConfig.parse("ngram+forced", max_draft_len=3), max_batch_size=2)
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    async with Engine(tiny_float, config) as engine:
        await engine.complete("Once upon a time", sampling=greedy)      # every step fills (no rows)
        metrics = await engine.metrics()
    assert 0 < metrics.exposed_grammar_s <= metrics.step_s, metrics


async def test_a_failed_capture_runs_that_shape_eagerly_and_is_counted(tiny_float, monkeypatch) -> None:
    """Planted: the forward reads a device value on the host (allowed eagerly, a counted sync; a
    capture cannot record it). The capture ends, the shape is marked eager-only and counted, the
    step goes on eagerly: the output is the eager engine's, nothing crashes."""
    from interlock.actors.device.verifier import DeviceVerifier

    forward = DeviceVerifier.forward

    def syncs(self, shape=None) -> None:
        forward(self, shape)
        int(self.staging.dev.input_ids[0])             # a host read in device work

    cases = [case(i) for i in range(4)]
    eager = await run_cases(tiny_float, device_config("cpu", max_batch_size=2, capture_steps=False), cases)
    monkeypatch.setattr(DeviceVerifier, "forward", syncs)
    async with Engine(tiny_float, device_config("cpu", max_batch_size=2)) as engine:
        got = await complete_all(engine, cases, timeout_s=300)
        await wait_idle(engine)
        metrics = await engine.metrics()
    assert [c.token_ids for c in got] == [c.token_ids for c in eager]
    assert metrics.failed_captures >= 1 and metrics.replayed_steps == 0 and metrics.captured_programs == 0, metrics


@pytest.mark.parametrize("device", DEVICES)
async def test_greedy_speculative_equals_plain_across_a_grammar_switch(tiny_float, device: str) -> None:
    spec = Reasoning(then=JsonSchema(SCHEMA), max_reasoning_tokens=4)
    greedy = SamplingParams(temperature=0.0, max_tokens=40)
    outs = []
    for mode in ("none", "ngram+forced"):
        async with Engine(tiny_float, device_config(device, mode, max_batch_size=2)) as engine:
            outs.append(await engine.complete("abc abc abc abc", grammar=spec, sampling=greedy))
            await assert_all_free(engine)
    assert outs[0].token_ids == outs[1].token_ids and outs[0].reasoning_text


@pytest.mark.parametrize("device", DEVICES)
async def test_a_nan_row_fails_only_its_request(tiny_float, device: str) -> None:
    """A token whose embedding is NaN (a corrupt weight row) reaches only the request that uses it:
    its rows are NaN, it fails alone, and the neighbour decoding beside it (in the same captured
    buckets) gets exactly its clean output. The poison is data, as a replayed program sees it."""
    tok = tiny_float.tokenizer
    victim, neighbour = "zebra zebra zebra", "Once upon a time"
    bad = next(t for t in tok.encode(victim) if t not in tok.encode(neighbour))
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    async with Engine(tiny_float, device_config(device, max_batch_size=2)) as engine:
        expected = (await engine.complete(neighbour, sampling=greedy)).token_ids
    engine = Engine(tiny_float, device_config(device, max_batch_size=2))
    model = engine.model.model
    model.embed = model.embed.clone()               # this engine's copy only: the fixture stays clean
    model.embed[bad] = float("nan")
    async with engine:
        results: dict[str, object] = {}

        async def one(name: str, prompt: str) -> None:
            try:
                results[name] = (await engine.complete(prompt, sampling=greedy)).token_ids
            except SamplingError as exc:
                results[name] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "neighbour", neighbour)
            tg.start_soon(one, "victim", victim)
        assert isinstance(results["victim"], SamplingError)
        assert results["neighbour"] == expected
        assert (await engine.metrics()).replayed_steps > 0
        await wait_idle(engine)
        await assert_all_free(engine)


@pytest.mark.parametrize("device", DEVICES)
async def test_cancelled_requests_leak_nothing(tiny_float, device: str) -> None:
    async with Engine(tiny_float, device_config(device, max_batch_size=4)) as engine:
        async def cut_short(i: int) -> None:
            n = 0
            async for _ in engine.generate(f"Once upon a time {i}", sampling=SamplingParams(max_tokens=50)):
                n += 1
                if n == 3:
                    break

        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(cut_short, i)
        await wait_idle(engine)
        await assert_all_free(engine)


@pytest.mark.parametrize("device", DEVICES)
async def test_prefix_caching_is_exact(tiny_float, device: str) -> None:
    prompt = "word " * 40
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    outs = {}
    for caching in (False, True):
        async with Engine(tiny_float, device_config(device, prefix_caching=caching, max_batch_size=2)) as engine:
            outs[caching] = [(await engine.complete(prompt, sampling=greedy)).token_ids for _ in range(2)]
            cached = (await engine.metrics()).cached_prompt_tokens
        assert (cached > 0) == caching
    assert outs[True] == outs[False] and outs[True][0] == outs[True][1]


@pytest.mark.parametrize("device", DEVICES)
async def test_what_it_does_not_run_yet_is_refused_by_name(tiny_float, device: str) -> None:
    """Tensor parallelism on CUDA has not run (docs/scaling.md): refused by name, at start. On the
    CPU the device runner has its own ranks (tests/parallel/test_device_tp.py): the host runner's
    are refused with what to load instead."""
    why = "tensor parallelism is not on CUDA yet" if device == "cuda" else "started for the host runner"
    ranks = replace(tiny_float, model=object.__new__(TensorParallelModel))     # the type is what decides
    with pytest.raises(UnsupportedModelError, match=why):
        Engine(ranks, device_config(device))


async def test_the_captured_step_keeps_the_fill_off_the_forwards_path(tiny_float) -> None:
    """The engine's own captured program, on the CUDA-rules timeline: the forward depends on no host
    function, the verification on the grammar's fill, and a step runs two host functions."""
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    async with Engine(tiny_float, device_config("cpu", max_batch_size=2)) as engine:
        await engine.complete("Once upon a time", grammar=JsonSchema(SCHEMA), sampling=greedy)
        programs = list(engine._rt.program._programs.values())        # closed when the engine stops
        assert programs
        check_programs(programs)


def check_programs(programs) -> None:
    from interlock.streams.program_graph import ancestors, find, host_functions

    for program in programs:
        deps = ancestors(program)
        (forward,) = find(program, "DeviceVerifier.forward", "device")
        (verify,) = find(program, "DeviceVerifier.verify", "device")
        (fill,) = find(program, "GrammarActor.fill", "host")
        assert host_functions(program, deps[forward]) == []
        assert fill in deps[verify]
        assert [e.name for e in program.entries if e.kind == "host"] == ["GrammarActor.fill", "StepProgram._tail"]
