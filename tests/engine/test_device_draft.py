"""Draft models on the device runner (drafters/device_draft.py): K draft rounds inside the captured
step, each draw under the grammar's draft-side row, on the CPU under CUDA's rules (and on CUDA
where there is one). They change speed, never output; a draft equal to the target is always
accepted, sampled drafts included (q is exactly their law); with masking no draft leaves the
grammar; a step runs one host function per draft round; seeds, cancels and leaks as everywhere.
The stochastic law with sampled model drafts is tests/engine/test_point_mass_stats.py's."""
from __future__ import annotations

import anyio
import pytest
import torch

from interlock.actors.grammar_actor import GrammarActor
from interlock.engine import Engine, EngineConfig
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from helpers import (GRAMMARS, PROMPTS, SCHEMA, assert_all_free, complete_all, draft_spec, seeded_alone_and_batched,
                     wait_idle)
from resources import DEVICE_CONTEXT

K = 3
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                   reason="needs a CUDA device"))]


def spec(kind: str, tiny, **kw) -> SpeculativeConfig | None:
    return draft_spec(kind, tiny, K, **kw)


def config(speculative: SpeculativeConfig | None, device: str = "cpu", **kw) -> EngineConfig:
    return EngineConfig(speculative=speculative, runner="device", device=device, max_context=DEVICE_CONTEXT, **kw)


async def outputs(tiny, speculative, sampling: SamplingParams, device: str = "cpu", n: int = 6, **kw):
    cases = [(PROMPTS[i % len(PROMPTS)], GRAMMARS[i % len(GRAMMARS)], sampling) for i in range(n)]
    async with Engine(tiny, config(speculative, device, max_batch_size=4, **kw)) as engine:
        out = await complete_all(engine, cases, timeout_s=300)
        await wait_idle(engine)
        await assert_all_free(engine)
        metrics = await engine.metrics()
    return out, metrics


@pytest.fixture(scope="module")
def greedy_baseline(tiny_float):
    return anyio.run(outputs, tiny_float, None, SamplingParams(max_tokens=20))[0]


@pytest.mark.parametrize("kind,masking", [("draft=target", True), ("self-draft", True), ("self-draft", False),
                                          ("self-draft+ngram+adaptive", True), ("d2t-subset", True),
                                          ("d2t-permutation", False)])
async def test_greedy_output_equals_no_speculation(tiny_float, greedy_baseline, kind: str, masking: bool) -> None:
    got, metrics = await outputs(tiny_float, spec(kind, tiny_float, draft_masking=masking),
                                 SamplingParams(max_tokens=20))
    assert [c.token_ids for c in got] == [c.token_ids for c in greedy_baseline]
    assert sum(c.stats.steps for c in got) < sum(c.stats.steps for c in greedy_baseline)
    assert metrics.replayed_steps > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["draft=target", "d2t-permutation"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
async def test_a_draft_equal_to_the_target_is_always_accepted(tiny_float, device: str, kind: str,
                                                              temperature: float) -> None:
    sampling = SamplingParams(max_tokens=24, temperature=temperature, seed=7)
    got, _ = await outputs(tiny_float, spec(kind, tiny_float), sampling, device)
    drafted = [c for c in got if c.stats.drafted]
    assert drafted and all(c.stats.acceptance_rate == 1.0 for c in drafted), [c.stats for c in got]


@pytest.mark.parametrize("masking", [True, False])
async def test_with_draft_masking_every_draft_is_in_the_grammar(tiny_float, monkeypatch, masking: bool) -> None:
    """The grammar's verify rows cover every draft (rows filled == drafts + 1) with masking; without
    it the 1-layer self-draft of a random model drafts refused tokens (the check can fail)."""
    rows: list[tuple[int, int]] = []
    fill = GrammarActor.fill

    def spy_fill(self):
        fill(self)
        rows.extend((int(self.buffers.rows[self.step[slot].lane]), len(self.step[slot].drafts))
                    for slot, _, _ in self._constrained())

    monkeypatch.setattr(GrammarActor, "fill", spy_fill)
    cfg = config(spec("self-draft", tiny_float, draft_masking=masking), max_batch_size=4)
    async with Engine(tiny_float, cfg) as engine:
        for i, prompt in enumerate(PROMPTS[:4]):
            sampling = SamplingParams(max_tokens=20, temperature=0.0 if i % 2 else 0.9, seed=i)
            await engine.complete(prompt, grammar=JsonSchema(SCHEMA), sampling=sampling)
        await assert_all_free(engine)
    assert rows and any(n for _, n in rows)
    cut = [r for r in rows if r[0] != r[1] + 1]
    assert (not cut) if masking else cut


async def test_one_host_function_per_draft_round(tiny_float) -> None:
    """Per step with draft rounds: K round functions, the fill and the tail, in that order, on the one
    host thread; the captured program's forward waits for no host function that follows the fill."""
    cfg = config(spec("self-draft", tiny_float), max_batch_size=2, trace_host_functions=True)
    async with Engine(tiny_float, cfg) as engine:
        await engine.complete("Once upon a time", grammar=JsonSchema(SCHEMA), sampling=SamplingParams(max_tokens=16))
        names = [c.name for c in engine.host_trace()]
        assert {c.thread for c in engine.host_trace()} == {"interlock-host-functions"}
    steps, step = [], []
    for name in names:
        step.append(name)
        if name == "StepProgram._tail":
            steps.append(step)
            step = []
    rounds = [s for s in steps if "StepProgram._finish_and_fill" in s]
    assert rounds, steps
    for s in rounds:
        assert s == ["StepProgram._draft_rows"] * K + ["StepProgram._finish_and_fill", "StepProgram._tail"]


async def test_same_seed_same_output_alone_or_in_a_batch(tiny_float) -> None:
    alone, batched = await seeded_alone_and_batched(tiny_float, spec("self-draft", tiny_float), seeded=2, noise=2,
                                                    batch=4, timeout_s=300, runner="device", device="cpu",
                                                    max_context=DEVICE_CONTEXT)
    assert batched == alone


async def test_cancelled_requests_free_the_draft_cache(tiny_float) -> None:
    async with Engine(tiny_float, config(spec("self-draft", tiny_float), max_batch_size=4)) as engine:
        async def leave_early(i: int) -> None:
            n = 0
            async for _ in engine.generate(PROMPTS[i % len(PROMPTS)], grammar=GRAMMARS[i % len(GRAMMARS)],
                                           sampling=SamplingParams(max_tokens=40)):
                n += 1
                if n == 3:
                    break

        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(leave_early, i)
        await wait_idle(engine)
        await assert_all_free(engine)
        res = await engine.resources()
        assert res["draft_kv_free_blocks"] == res["draft_kv_total_blocks"] and res["draft_requests"] == 0


async def test_replayed_rounds_apply_every_table_update_whatever_the_captured_count(tiny_float) -> None:
    """A captured step's draft-table updates are a fixed padded room, as the target's: a replay whose
    step writes more (or fewer) block-table entries than the captured one still leaves the draft
    cache's device tables equal to the host's mirror, and captured rounds draft what eager ones do.
    Blocks of 8 and a pruned 1-layer draft (rejections) make the count vary from 0 to 2 a step."""
    async def run(capture: bool):
        cfg = config(spec("d2t-subset", tiny_float), max_batch_size=2, block_size=8, capture_steps=capture)
        async with Engine(tiny_float, cfg) as engine:
            cases = [(PROMPTS[i % len(PROMPTS)], None, SamplingParams(max_tokens=40, ignore_eos=True))
                     for i in range(2)]
            out = await complete_all(engine, cases, timeout_s=300)
            await wait_idle(engine)
            drafter, metrics = engine._rt.drafter, await engine.metrics()
            tables = drafter.tables.cpu()
            for slot, known in enumerate(drafter.mirror.known):
                assert tables[slot, : len(known)].tolist() == known, f"slot {slot}'s draft table"
        return out, metrics

    eager, _ = await run(False)
    captured, metrics = await run(True)
    assert metrics.replayed_steps > 0
    assert [(c.token_ids, c.stats.drafted, c.stats.accepted) for c in captured] == \
        [(c.token_ids, c.stats.drafted, c.stats.accepted) for c in eager]
