"""Where a step's matcher commits run (actors/grammar_actor.py): the tail advances only the matchers
the next prologue reads (forced tokens, the host runner's draft check); every other request's
commit is applied by the next step's first grammar-lane host function, under its forward.

- the split schedule gives the all-in-the-tail schedule's output token for token, on both runners,
  with lookup drafts, forced drafts, a draft model and none, and it does move the commits where
  nothing before the forward reads the matcher (and only there);
- a request released between steps takes its pending commit with it: the slot's next request
  decodes as it does alone;
- a deferred commit the matcher refuses fails its request alone (tests/engine/test_step_program.py
  has the tail's own refusal).
"""
from __future__ import annotations

import anyio
import pytest

from interlock.engine import Engine, EngineConfig
from interlock.protocol.grammar import JsonSchema, Regex
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from helpers import SCHEMA, assert_all_free, complete_all, wait_idle
from resources import DEVICE_CONTEXT

CASES = [("Once upon a time", Regex(r"[a-z]{3,9}( [a-z]{2,5}){0,4}"), SamplingParams(max_tokens=16)),
         ("JSON please", JsonSchema(SCHEMA), SamplingParams(max_tokens=20)),
         ("abc abc abc abc", JsonSchema(SCHEMA), SamplingParams(temperature=0.9, seed=3, max_tokens=20)),
         ("The weather today", None, SamplingParams(max_tokens=10))]
# mode -> does the next prologue read a speculating request's matcher on (host runner, device runner)?
MODES = {"none": (False, False), "ngram": (True, False), "ngram+forced": (True, True),
         "self-draft": (False, False)}


def spec(mode: str) -> SpeculativeConfig | None:
    if mode == "none":
        return None
    if mode == "self-draft":
        return SpeculativeConfig(("self-draft",), max_draft_len=3, self_draft_layers=1)
    return SpeculativeConfig.parse(mode, max_draft_len=3)


class Where:
    """Counts the matcher commits the tail applies and those a later step's readers apply."""

    def __init__(self, grammar) -> None:
        self.tail = self.later = 0
        commit, settle = grammar.masks.commit, grammar._settle

        def counted_commit(matchers, tokens):
            self.tail += len(matchers)
            return commit(matchers, tokens)

        def counted_settle(requests):           # (slot, request id) pairs; pending commits go by request id
            self.later += sum(rid in grammar._pending for _, rid in requests)
            return settle(requests)

        grammar.masks.commit, grammar._settle = counted_commit, counted_settle


async def run(model, runner: str, mode: str, defer: bool) -> tuple[list, Where]:
    config = EngineConfig(speculative=spec(mode), runner=runner, max_batch_size=4, max_context=DEVICE_CONTEXT)
    async with Engine(model, config) as engine:
        grammar = engine._rt.program.grammar
        grammar.defer_commits = defer
        where = Where(grammar)
        out = await complete_all(engine, CASES, timeout_s=300)
        await wait_idle(engine)
        await assert_all_free(engine)
    return out, where


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("runner", ["host", "device"])
async def test_the_split_schedule_gives_the_tail_schedules_output(tiny, tiny_float, runner: str, mode: str) -> None:
    if runner == "device" and mode == "self-draft":
        pytest.skip("the device runner's draft model is tests/engine/test_device_draft.py's")
    model = tiny if runner == "host" else tiny_float
    tail, in_tail = await run(model, runner, mode, defer=False)
    split, moved = await run(model, runner, mode, defer=True)
    assert [c.token_ids for c in split] == [c.token_ids for c in tail]
    assert [c.finish_reason for c in split] == [c.finish_reason for c in tail]
    assert in_tail.later == 0 and in_tail.tail > 0
    read_by_prologue = MODES[mode][runner == "device"]
    if read_by_prologue:
        assert moved.later == 0 and moved.tail == in_tail.tail
    else:
        assert moved.later > 0 and moved.tail == 0, (moved.tail, moved.later)


@pytest.mark.parametrize("runner", ["host", "device"])
async def test_a_release_takes_its_pending_commit_with_it(tiny, tiny_float, runner: str) -> None:
    """One slot: a request cancelled after its first tokens (its last commit pending), then another
    on the same slot, which must decode as it does in a fresh engine."""
    model = tiny if runner == "host" else tiny_float
    config = EngineConfig(speculative=None, runner=runner, max_batch_size=1)
    prompt, grammar, sampling = CASES[1]
    async with Engine(model, config) as engine:
        alone = (await engine.complete(prompt, grammar=grammar, sampling=sampling)).token_ids
    async with Engine(model, config) as engine:
        with anyio.fail_after(120):
            async for _ in engine.generate("Once upon a time", grammar=JsonSchema(SCHEMA),
                                           sampling=SamplingParams(max_tokens=20)):
                break
            await wait_idle(engine)
            assert not engine._rt.program.grammar._pending
            again = (await engine.complete(prompt, grammar=grammar, sampling=sampling)).token_ids
        await assert_all_free(engine)
    assert again == alone
