"""Draft models (a separate checkpoint, the layer-skip self-draft, a pruned d2t vocabulary) change
speed, never output; draft-side masking keeps every draft inside the grammar (tiny preset)."""
from __future__ import annotations

import anyio
import pytest

from interlock.actors.grammar_actor import GrammarActor
from interlock.engine import Engine, EngineConfig
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from helpers import GRAMMARS, PROMPTS, SCHEMA, assert_all_free, complete_all, draft_spec, seeded_alone_and_batched

K = 3


def spec(kind: str, tiny, **kw) -> SpeculativeConfig:
    spec = draft_spec(kind, tiny, K, **kw)
    assert spec is not None
    return spec


async def outputs(tiny, speculative: SpeculativeConfig | None, sampling: SamplingParams, n: int = 8):
    """Every (prompt, grammar) case run side by side; returns the completions in case order."""
    cases = [(PROMPTS[i % len(PROMPTS)], GRAMMARS[i % len(GRAMMARS)], sampling) for i in range(n)]
    async with Engine(tiny, EngineConfig(speculative=speculative, max_batch_size=8)) as engine:
        out = await complete_all(engine, cases)
        await assert_all_free(engine)
    return out


@pytest.fixture(scope="module")
def greedy_baseline(tiny):
    return anyio.run(outputs, tiny, None, SamplingParams(max_tokens=24))


@pytest.mark.parametrize("kind", ["draft=target", "self-draft", "self-draft+ngram+adaptive", "d2t-subset",
                                  "d2t-permutation"])
@pytest.mark.parametrize("masking", [True, False])
async def test_greedy_output_equals_no_speculation(tiny, greedy_baseline, kind: str, masking: bool) -> None:
    got = await outputs(tiny, spec(kind, tiny, draft_masking=masking), SamplingParams(max_tokens=24))
    assert [c.token_ids for c in got] == [c.token_ids for c in greedy_baseline]
    assert sum(c.stats.steps for c in got) < sum(c.stats.steps for c in greedy_baseline)


@pytest.mark.parametrize("kind", ["draft=target", "d2t-permutation"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
async def test_draft_equal_to_target_is_always_accepted(tiny, kind: str, temperature: float) -> None:
    sampling = SamplingParams(max_tokens=24, temperature=temperature, seed=7)
    got = await outputs(tiny, spec(kind, tiny), sampling)
    for c in got:
        if c.stats.drafted:
            assert c.stats.acceptance_rate == 1.0, c.stats
    # Every step but the last (cut by max_tokens or a stop) emits K drafts + the bonus token.
    full = [c for c in got if c.stats.steps > 1 and c.finish_reason == "length" and c.stats.output_tokens % (K + 1) == 0]
    assert full and all(c.stats.mean_acceptance_length == K + 1 for c in full)


@pytest.mark.parametrize("masking", [True, False])
async def test_draft_side_masking_keeps_every_draft_in_the_grammar(tiny, monkeypatch, masking: bool) -> None:
    """With masking, every draft the model proposes is valid; without it, the 1-layer self-draft of a
    random model proposes refused tokens (which shows the check can fail). Either way the grammar
    lane cuts those before the forward, so every row the verifier gets is valid (1 + drafts)."""
    seen: list[tuple[int, int]] = []         # (drafts the grammar allows, drafts) as proposed
    rows: list[tuple[int, int]] = []         # (valid rows, drafts) the verifier gets
    check, fill = GrammarActor.check, GrammarActor.fill

    def spy_check(self):
        seen.extend((m.validate(self.step[slot].drafts), len(self.step[slot].drafts))
                    for slot, _, m in self._constrained())
        check(self)

    def spy_fill(self):
        fill(self)
        rows.extend((int(self.buffers.rows[self.step[slot].lane]), len(self.step[slot].drafts))
                    for slot, _, _ in self._constrained())

    monkeypatch.setattr(GrammarActor, "check", spy_check)
    monkeypatch.setattr(GrammarActor, "fill", spy_fill)
    cfg = EngineConfig(speculative=spec("self-draft", tiny, draft_masking=masking), max_batch_size=4)
    async with Engine(tiny, cfg) as engine:
        for i, prompt in enumerate(PROMPTS):
            sampling = SamplingParams(max_tokens=24, temperature=0.0 if i % 2 else 0.9, seed=i)
            await engine.complete(prompt, grammar=JsonSchema(SCHEMA), sampling=sampling)
        await assert_all_free(engine)
    assert seen and any(n for _, n in seen)
    violated = [r for r in seen if r[0] != r[1]]
    assert (not violated) if masking else violated
    assert rows and all(valid == n + 1 for valid, n in rows)


async def test_same_seed_same_output_alone_or_in_a_batch_of_8_with_a_draft_model(tiny) -> None:
    alone, batched = await seeded_alone_and_batched(tiny, spec("self-draft", tiny))
    assert batched == alone


async def test_cancelled_requests_free_the_draft_cache(tiny) -> None:
    async with Engine(tiny, EngineConfig(speculative=spec("self-draft", tiny), max_batch_size=4)) as engine:
        async def leave_early(i: int) -> None:
            async for _ in engine.generate(PROMPTS[i % len(PROMPTS)], grammar=GRAMMARS[i % len(GRAMMARS)],
                                           sampling=SamplingParams(max_tokens=40)):
                break

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(leave_early, i)
        with anyio.fail_after(30):
            while (await engine.resources())["requests"]:
                await anyio.sleep(0.01)
        await assert_all_free(engine)


def test_a_draft_with_another_tokenizer_is_refused(tiny, monkeypatch) -> None:
    from dataclasses import replace

    from interlock.engine import load as engine_module      # where draft_lm_for loads a draft
    from interlock.protocol.errors import UnsupportedModelError

    stranger = replace(tiny, tokenizer=replace(tiny.tokenizer, eos_token_ids=(12345,)))
    monkeypatch.setattr(engine_module, "load_model", lambda *a, **k: stranger)
    with pytest.raises(UnsupportedModelError, match="tokenizer"):
        Engine(tiny, EngineConfig(speculative=SpeculativeConfig.parse("draft:elsewhere")))
