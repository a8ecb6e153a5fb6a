"""The bad-input catalogue: every bad input a user can give, the typed error it gets, and a
neighbour request, running beside it in the same engine, that finishes with exactly its solo output.
After each case every resource is free again. docs/usage.md has the same table.
"""
from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import pytest

from interlock.engine import Engine, EngineConfig
from interlock.protocol.errors import (
    EmptyPromptError, GrammarError, InvalidParameterError, PromptTooLongError, RequestError,
)
from interlock.protocol.grammar import Choice, Ebnf, GrammarConfig, JsonSchema, Regex, StructuralTag, Tag
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from helpers import assert_all_free, wait_idle


NEIGHBOUR = ("JSON please", JsonSchema({"type": "object", "properties": {"a": {"enum": [1, 22]},
                                                                           "b": {"type": "boolean"}},
                                        "required": ["a", "b"], "additionalProperties": False}),
             SamplingParams(max_tokens=24))
CANCELLED = "cancelled"          # the consumer's own cancellation: nothing is raised to anyone else


def _deep(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


SLOW_SCHEMA = {"type": "object", "properties": {f"k{i}": {"type": "string", "pattern": "[a-z]{3}[0-9]{2}"}
                                                for i in range(3000)}}


class Junk:
    """A user drafter that returns ids outside the vocabulary (and some inside)."""

    def propose(self, requests, k):
        return [[10**9, -1, 5][: k] for _ in requests]


@dataclass(frozen=True)
class Bad:
    error: type[BaseException] | str
    run: Callable[[Engine], Awaitable[object]]
    engine: dict = field(default_factory=dict)       # EngineConfig overrides for this case


async def _complete(engine: Engine, prompt="JSON please", grammar=None, **sampling):
    return await engine.complete(prompt, grammar=grammar, sampling=SamplingParams(max_tokens=16, **sampling))


def _sampling(**kw) -> Callable[[Engine], Awaitable[object]]:
    async def run(engine: Engine) -> None:
        await engine.complete("hi", sampling=SamplingParams(**kw))
    return run


async def _cancel_when(engine: Engine, ready: Callable[[dict, int], bool], prompt="JSON please",
                       grammar=None) -> str:
    """Start a request in its own task, wait until `ready(resources, steps)`, cancel the task."""
    sampling = SamplingParams(max_tokens=200, ignore_eos=grammar is None)     # long enough to be caught
    steps0 = (await engine.metrics()).steps
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: engine.complete(prompt, grammar=grammar, sampling=sampling))
            with anyio.fail_after(30):
                while not ready(await engine.resources(), (await engine.metrics()).steps - steps0):
                    await anyio.sleep(0.002)
            scope.cancel()
    assert scope.cancelled_caught
    return CANCELLED


async def _fails_while_prefilling(engine: Engine) -> None:
    """Its grammar's compile fails only after the request's prefill has started: the error arrives
    while a step holding the request is on the lanes (the race a fast-failing schema never hits)."""
    late = JsonSchema({"type": "object", "title": "fails late"})
    compile_real = engine.grammars.compile
    steps0 = (await engine.metrics()).steps

    async def compile_late(spec, backend=None):
        if spec != late:
            return await compile_real(spec, backend)
        while (await engine.metrics()).steps - steps0 < 2:
            await anyio.sleep(0.001)
        raise GrammarError("this grammar fails after its prompt began prefilling (test)")

    engine.grammars.compile = compile_late
    await _complete(engine, prompt="word " * 100, grammar=late)


async def _slow_reader(engine: Engine) -> str:
    prompt, grammar, sampling = NEIGHBOUR
    solo = await engine.complete(prompt, grammar=grammar, sampling=sampling)
    got = []
    async for delta in engine.generate(prompt, grammar=grammar, sampling=sampling):
        got.extend(delta.token_ids)
        await anyio.sleep(0.05)               # far slower than the engine: its stream fills, it pauses
    assert tuple(got) == solo.token_ids
    return "complete"


async def _stops_reading(engine: Engine) -> str:
    stream = engine.generate("Once upon a time", sampling=SamplingParams(max_tokens=200, ignore_eos=True))
    await stream.__anext__()
    await stream.aclose()                      # the consumer walks away: the request is cancelled
    return CANCELLED


async def _oov_drafter(engine: Engine) -> str:
    prompt, grammar, sampling = NEIGHBOUR
    got = await engine.complete(prompt, grammar=grammar, sampling=sampling)
    async with Engine(engine.model, EngineConfig(speculative=None, max_batch_size=1)) as plain:
        want = await plain.complete(prompt, grammar=grammar, sampling=sampling)
    assert got.token_ids == want.token_ids
    return "complete"


CATALOGUE: dict[str, Bad] = {
    # grammars
    "schema: unknown type": Bad(GrammarError, lambda e: _complete(e, grammar=JsonSchema({"type": "no-such-type"}))),
    "schema: not JSON": Bad(GrammarError, lambda e: _complete(e, grammar=JsonSchema("{not json"))),
    "schema: nested 100 deep": Bad(GrammarError, lambda e: _complete(e, grammar=JsonSchema(_deep(100)))),
    "schema: over max_schema_bytes": Bad(GrammarError, lambda e: _complete(e, grammar=JsonSchema(
        {"type": "object", "properties": {f"k{i}" + "x" * 200: {"type": "string"} for i in range(2000)}}))),
    "schema: compile timeout": Bad(GrammarError, lambda e: _complete(e, grammar=JsonSchema(SLOW_SCHEMA)),
                                   {"grammar": GrammarConfig(compile_timeout_s=0.05)}),
    "schema: unsupported keyword (not)": Bad(GrammarError, lambda e: _complete(
        e, grammar=JsonSchema({"type": "string", "not": {"const": "a"}}))),
    "schema: compile fails while the prompt prefills": Bad(GrammarError, _fails_while_prefilling,
                                                           {"prefill_chunk": 16}),
    "regex: invalid": Bad(GrammarError, lambda e: _complete(e, grammar=Regex("("))),
    "regex: ends in a backslash (both backends compile it)": Bad(GrammarError, lambda e: _complete(
        e, grammar=Regex("ab\\"))),
    "ebnf: invalid": Bad(GrammarError, lambda e: _complete(e, grammar=Ebnf("root ::= ( \"a\""))),
    "ebnf: undefined rule": Bad(GrammarError, lambda e: _complete(e, grammar=Ebnf("root ::= missing"))),
    "choice: empty list": Bad(GrammarError, lambda e: _complete(e, grammar=Choice([]))),
    "choice: no token can produce it": Bad(RequestError, lambda e: _complete(e, grammar=Choice(["\x16"]))),
    # prompts
    "prompt: empty string": Bad(EmptyPromptError, lambda e: _complete(e, prompt="")),
    "prompt: empty message list": Bad(EmptyPromptError, lambda e: _complete(e, prompt=[])),
    "prompt: not str or messages": Bad(InvalidParameterError, lambda e: _complete(e, prompt=42)),
    "prompt: over the context": Bad(PromptTooLongError, lambda e: _complete(e, prompt="word " * 400),
                                    {"max_context": 128}),
    "negative_prompt without guidance": Bad(RequestError, lambda e: e.complete("hi", negative_prompt="x")),
    "prompt: token id past the vocabulary": Bad(InvalidParameterError, lambda e: _complete(e, prompt=[1, 2, 10**6])),
    "prompt: negative token id": Bad(InvalidParameterError, lambda e: _complete(e, prompt=[-1, 2])),
    "prompt: token ids (runs)": Bad("complete", lambda e: _complete(e, prompt=[5, 6, 7])),
    "grammar_backend: unknown": Bad(InvalidParameterError, lambda e: e.complete(
        "hi", grammar=Choice(["a", "b"]), grammar_backend="outlines")),
    "sampling: logprobs 21": Bad(InvalidParameterError, _sampling(logprobs=21)),
    # sampling values (refused when SamplingParams is built, before generate)
    "sampling: temperature nan": Bad(InvalidParameterError, _sampling(temperature=math.nan)),
    "sampling: temperature inf": Bad(InvalidParameterError, _sampling(temperature=math.inf)),
    "sampling: top_p nan": Bad(InvalidParameterError, _sampling(top_p=math.nan)),
    "sampling: top_k -1": Bad(InvalidParameterError, _sampling(top_k=-1)),
    "sampling: max_tokens 0": Bad(InvalidParameterError, _sampling(max_tokens=0)),
    "sampling: guidance_scale inf": Bad(InvalidParameterError, _sampling(guidance_scale=math.inf)),
    "sampling: empty stop string": Bad(InvalidParameterError, _sampling(stop=("",))),
    "sampling: 10,000 stop strings": Bad(InvalidParameterError, _sampling(stop=["x"] * 10_000)),
    "sampling: seed 2**70 (reduced, runs)": Bad("complete", lambda e: _complete(e, temperature=1.0, seed=2**70)),
    "sampling: seed -1 (reduced, runs)": Bad("complete", lambda e: _complete(e, temperature=1.0, seed=-1)),
    "sampling: bool seed": Bad(InvalidParameterError, _sampling(seed=True)),
    "sampling: ignore_eos with a grammar": Bad(InvalidParameterError, lambda e: _complete(
        e, grammar=Choice(["alpha", "beta"]), ignore_eos=True)),
    "sampling: not a SamplingParams": Bad(InvalidParameterError, lambda e: e.complete("hi", sampling={"t": 1})),
    # drafters and consumers
    "user drafter: out-of-vocabulary ids": Bad("complete", _oov_drafter,
                                               {"speculative": SpeculativeConfig((), max_draft_len=3,
                                                                                 user_drafter=Junk())}),
    "consumer: reads slowly": Bad("complete", _slow_reader, {"output_buffer": 1}),
    "consumer: stops reading (closes the stream)": Bad(CANCELLED, _stops_reading),
    "cancel: while queued": Bad(CANCELLED, lambda e: _cancel_when(e, lambda r, s: r["requests"] == 2),
                                {"max_batch_size": 1}),
    "cancel: while compiling": Bad(CANCELLED, lambda e: _cancel_when(e, lambda r, s: r["requests"] == 2,
                                                                     grammar=JsonSchema(SLOW_SCHEMA))),
    "cancel: while prefilling": Bad(CANCELLED, lambda e: _cancel_when(
        e, lambda r, s: r["requests"] == 2 and s >= 1, prompt="word " * 100), {"prefill_chunk": 16}),
    # Not `requests == 2`: the neighbour can finish within the poll's blind spot, and the wait would
    # then never end; the two start together, so they shared the first steps anyway.
    "cancel: mid-step (after its first tokens)": Bad(CANCELLED, lambda e: _cancel_when(
        e, lambda r, s: r["requests"] >= 1 and s >= 3)),
}
MARKS: dict[str, pytest.MarkDecorator] = {}


def _config(**overrides) -> EngineConfig:
    base = dict(speculative=SpeculativeConfig(("ngram", "forced"), max_draft_len=3), max_batch_size=2)
    return EngineConfig(**(base | overrides))


@pytest.fixture(scope="module")
def solo(tiny) -> tuple[int, ...]:
    async def run() -> tuple[int, ...]:
        async with Engine(tiny, _config(max_batch_size=1)) as engine:
            prompt, grammar, sampling = NEIGHBOUR
            return (await engine.complete(prompt, grammar=grammar, sampling=sampling)).token_ids
    return anyio.run(run)


async def run_case(tiny, name: str, solo: tuple[int, ...]) -> object:
    bad = CATALOGUE[name]
    async with Engine(tiny, _config(**bad.engine)) as engine:
        outcome: dict[str, object] = {}

        async def neighbour() -> None:
            prompt, grammar, sampling = NEIGHBOUR
            outcome["neighbour"] = (await engine.complete(prompt, grammar=grammar, sampling=sampling)).token_ids

        async def culprit() -> None:
            if bad.engine.get("max_batch_size") == 1:   # queued behind the neighbour: let it take the slot
                while (await engine.resources())["requests"] == 0:
                    await anyio.sleep(0.002)
            try:
                result = await bad.run(engine)
                outcome["culprit"] = result if isinstance(result, str) else "complete"
            except RequestError as exc:
                outcome["culprit"] = exc

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(neighbour)
                tg.start_soon(culprit)
        assert outcome["neighbour"] == solo, "the neighbour's output changed"
        await wait_idle(engine)
        await assert_all_free(engine)
        assert (await engine.complete("still up?", sampling=SamplingParams(max_tokens=4))).finish_reason
    return outcome["culprit"]


@pytest.mark.parametrize("name", [pytest.param(n, marks=MARKS.get(n, ())) for n in CATALOGUE])
async def test_bad_input_gets_its_typed_error_and_the_neighbour_its_solo_output(tiny, solo, name: str) -> None:
    got = await run_case(tiny, name, solo)
    want = CATALOGUE[name].error
    if isinstance(want, str):
        assert got == want, f"{name}: expected {want}, got {got!r}"
    else:
        assert isinstance(got, want), f"{name}: expected {want.__name__}, got {got!r}"
        assert str(got)                                      # the message says what to do


@pytest.mark.parametrize("spec", [Regex("ab\\"), Regex("\\"),
                                  StructuralTag(["<r>"], [Tag("<r>", Regex("x\\"), "</r>")])],
                         ids=["ab-backslash", "backslash", "inside-a-tag"])
async def test_a_regex_no_output_could_pass_is_refused_before_anything_runs(tiny, spec) -> None:
    """The end-of-request check reads regexes with Python's `re`, which refuses a trailing backslash
    that both backends compile: the intake runs the same check, so nothing is queued or generated."""
    async with Engine(tiny, _config()) as engine:
        with pytest.raises(GrammarError, match="does not compile in Python"):
            await engine.complete("hi", grammar=spec)
        assert (await engine.metrics()).steps == 0
        await assert_all_free(engine)
