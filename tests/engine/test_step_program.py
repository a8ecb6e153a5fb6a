"""A step is one lane program: two event-loop entries per step, no message per step, the
replayed program gives the eager output token for token, and a per-request fault inside a step
fails that request only (tiny preset)."""
from __future__ import annotations

import anyio
import pytest

from interlock.actors.verifier_actor import VerifierActor
from interlock.engine import Engine, EngineConfig
from interlock.protocol.errors import DrafterError, GrammarError, SamplingError
from interlock.protocol.grammar import JsonSchema, Regex
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from helpers import SCHEMA, assert_all_free, complete_all, wait_idle

K = 3
MODES = {
    "none": None,
    "ngram+forced": SpeculativeConfig(("ngram", "forced"), max_draft_len=K),
    "self-draft+forced": SpeculativeConfig(("self-draft", "forced"), max_draft_len=K, self_draft_layers=1),
    "self-draft+ngram+adaptive": SpeculativeConfig(("self-draft", "ngram", "forced"), max_draft_len=K,
                                                   self_draft_layers=1, adaptive=True),
}
GREEDY = SamplingParams(max_tokens=20)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=20)


async def outputs(tiny, speculative, capture: bool, grammar, sampling) -> tuple[list[tuple[int, ...]], object]:
    prompts = ["Once upon a time", "JSON please", "abc abc abc abc"]
    async with Engine(tiny, EngineConfig(speculative=speculative, max_batch_size=4, capture_steps=capture)) as engine:
        out = await complete_all(engine, [(p, grammar, sampling) for p in prompts])
        await wait_idle(engine)
        await assert_all_free(engine)
        metrics = await engine.metrics()
    return [c.token_ids for c in out], metrics


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("grammar", [None, JsonSchema(SCHEMA)], ids=["free", "json"])
@pytest.mark.parametrize("mode", list(MODES))
async def test_replayed_steps_give_the_eager_output(tiny, mode: str, grammar, sampling) -> None:
    eager, eager_metrics = await outputs(tiny, MODES[mode], False, grammar, sampling)
    replayed, metrics = await outputs(tiny, MODES[mode], True, grammar, sampling)
    assert replayed == eager
    assert eager_metrics.replayed_steps == 0 and metrics.replayed_steps == metrics.steps > 0


@pytest.mark.parametrize("mode", list(MODES))
async def test_two_loop_entries_per_step_and_no_message_per_step(tiny, mode: str) -> None:
    """The lanes enter the loop once per step (token event) and the Scheduler once (launch). A step
    sends no message: the Scheduler calls the other actors' parts (the KV pool's reserve and rewind,
    the token event handled in the callback that delivers it), so the engine's message count is the
    same for a 6-token and a 30-token request, and the KV, grammar, draft and verifier actors, whom
    only queries reach, got none."""
    totals, per_actor, steps = [], [], []
    for max_tokens in (6, 30):
        async with Engine(tiny, EngineConfig(speculative=MODES[mode], max_batch_size=2)) as engine:
            # A grammar no output of 30 tokens can complete: every request runs exactly max_tokens tokens.
            await engine.complete("Once upon a time", grammar=Regex("[a-z ]{300,400}"),
                                  sampling=SamplingParams(max_tokens=max_tokens))
            metrics = await engine.metrics()
            s = engine._rt.scheduler
            per_actor.append(tuple(a.inbox.statistics().total_sent for a in (s.kv, s.grammar, s.draft, s.verifier)))
            assert metrics.loop_wakeups == 2 * metrics.steps and metrics.wakeups_per_step == 2.0
            totals.append(metrics.messages)
            steps.append(metrics.steps)
    assert steps[1] > steps[0] > 1, steps
    assert totals[0] == totals[1] > 0, (totals, steps)
    assert per_actor == [(0, 0, 0, 0)] * 2, per_actor


# --- per-request faults inside a step -------------------------------------------------------------

NEIGHBOUR = ("JSON please", JsonSchema(SCHEMA), SamplingParams(max_tokens=24))
VICTIM = ("Once upon a time", Regex(r"[a-z]{3,9}( [a-z]{2,5}){0,5}"), SamplingParams(max_tokens=24))


async def solo(tiny, speculative) -> tuple[int, ...]:
    async with Engine(tiny, EngineConfig(speculative=speculative, max_batch_size=2)) as engine:
        prompt, grammar, sampling = NEIGHBOUR
        return (await engine.complete(prompt, grammar=grammar, sampling=sampling)).token_ids


async def victim_and_neighbour(engine: Engine, error: type[BaseException]) -> tuple[int, ...]:
    """The victim (submitted first: req-0) must fail with `error`; returns the neighbour's output."""
    caught: list[BaseException] = []
    out: list[tuple[int, ...]] = []

    async def victim() -> None:
        prompt, grammar, sampling = VICTIM
        try:
            await engine.complete(prompt, grammar=grammar, sampling=sampling)
        except error as exc:
            caught.append(exc)

    async def neighbour() -> None:
        prompt, grammar, sampling = NEIGHBOUR
        out.append((await engine.complete(prompt, grammar=grammar, sampling=sampling)).token_ids)

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            tg.start_soon(victim)
            await anyio.sleep(0)
            tg.start_soon(neighbour)
    await wait_idle(engine)
    await assert_all_free(engine)
    assert len(caught) == 1, "the victim should fail with its typed error"
    return out[0]


@pytest.mark.parametrize("mode", ["ngram+forced", "self-draft+forced"])
async def test_a_nan_logits_row_fails_only_its_request(tiny, monkeypatch, mode: str) -> None:
    forward = VerifierActor.forward

    def poisoned(self) -> None:
        forward(self)
        work, offset = self._work, 0
        # The logits, or the rows the lean head turns into logits once the masks are in: NaN either way.
        name = "logits" if work.logits is not None else "hidden"
        rows = getattr(work, name).clone()           # the forward returns an inference tensor
        for i, drafts in zip(work.sampled, work.drafts):
            if work.plan.snapshots[i].request_id == "req-0":
                rows[offset] = float("nan")
            offset += len(drafts) + 1
        setattr(work, name, rows)

    expected = await solo(tiny, MODES[mode])
    monkeypatch.setattr(VerifierActor, "forward", poisoned)
    async with Engine(tiny, EngineConfig(speculative=MODES[mode], max_batch_size=2)) as engine:
        assert await victim_and_neighbour(engine, SamplingError) == expected
        assert (await engine.complete(*NEIGHBOUR[:1], grammar=NEIGHBOUR[1], sampling=NEIGHBOUR[2])).token_ids \
            == expected, "the engine goes on after the fault"


class _Refusing:
    """A matcher that refuses every committed token (a grammar lane invariant violation)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def accept(self, tokens) -> bool:
        return False

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("mode", ["ngram+forced", "none"])
async def test_a_token_the_grammar_refuses_fails_only_its_request(tiny, mode: str) -> None:
    """ngram+forced: the tail's commit refuses (the next prologue reads the matcher for its forced
    tokens); none: the commit left to the next step's fill refuses (actors/grammar_actor.py)."""
    mode = MODES[mode]
    expected = await solo(tiny, mode)
    async with Engine(tiny, EngineConfig(speculative=mode, max_batch_size=2)) as engine:
        router = engine.grammars.router         # what the GrammarActor makes matchers with
        compile_, matcher = engine.grammars.compile, router.matcher
        victims: set[int] = set()

        async def compile_marked(spec, backend=None):
            compiled = await compile_(spec, backend)
            if spec == VICTIM[1]:
                victims.add(id(compiled))
            return compiled

        engine.grammars.compile = compile_marked
        router.matcher = lambda compiled: _Refusing(matcher(compiled)) if id(compiled) in victims else matcher(compiled)
        assert await victim_and_neighbour(engine, GrammarError) == expected


class _FailsFor:
    """A user drafter that raises whenever `victim` is among the requests it is asked about."""

    def __init__(self, victim: str | None) -> None:
        self.victim = victim

    def propose(self, requests, k):
        if any(r.request_id == self.victim for r in requests):
            raise RuntimeError("drafter bug")
        return [[] for _ in requests]


async def test_a_user_drafter_exception_fails_only_its_request(tiny) -> None:
    expected = await solo(tiny, SpeculativeConfig(drafters=(), user_drafter=_FailsFor(None), max_draft_len=K))
    mode = SpeculativeConfig(drafters=(), user_drafter=_FailsFor("req-0"), max_draft_len=K)
    async with Engine(tiny, EngineConfig(speculative=mode, max_batch_size=2)) as engine:
        assert await victim_and_neighbour(engine, DrafterError) == expected
