"""Shared helpers of the engine tests (tests/engine/conftest.py puts this folder on sys.path)."""
from __future__ import annotations

import anyio
import torch

from resources import leaks

from interlock.engine import Engine, EngineConfig
from interlock.protocol.grammar import Choice, GrammarConfig, JsonSchema, Regex
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer"}}, "required": ["name", "age"]}
GRAMMARS = [None, JsonSchema(SCHEMA), Regex(r"[a-z]{3,9}( [a-z]{2,5}){0,3}"), Choice(["alpha", "beta", "gamma"])]
PROMPTS = ["Once upon a time", "The weather today", "List three colors:", "JSON please", "abc abc abc abc"]


def config(max_batch_size: int = 8, **kw) -> EngineConfig:
    return EngineConfig(speculative=SpeculativeConfig(("ngram", "forced"), max_draft_len=3),
                        max_batch_size=max_batch_size, **kw)


def case(i: int) -> tuple[str, object, SamplingParams]:
    return PROMPTS[i % len(PROMPTS)], GRAMMARS[i % len(GRAMMARS)], SamplingParams(max_tokens=12 + i % 7)


async def alone_outputs(tiny, n: int) -> dict[int, tuple[int, ...]]:
    out = {}
    async with Engine(tiny, config(1)) as engine:
        for i in range(n):
            prompt, grammar, sampling = case(i)
            out[i] = (await engine.complete(prompt, grammar=grammar, sampling=sampling)).token_ids
    return out


async def complete_all(engine: Engine, cases, *, timeout_s: float = 120, concurrency: int | None = None) -> list:
    """Every case side by side in one engine, at most `concurrency` in flight (None: all at once),
    started in case order; their Completions in case order. A case is (prompt, grammar, sampling),
    or (prompt, grammar, sampling, negative_prompt) under classifier-free guidance."""
    out: list = [None] * len(cases)
    limit = anyio.Semaphore(concurrency or max(1, len(cases)))

    async def one(i: int) -> None:
        prompt, grammar, sampling, *negative = cases[i]
        async with limit:
            out[i] = await engine.complete(prompt, grammar=grammar, sampling=sampling,
                                           negative_prompt=negative[0] if negative else None)

    with anyio.fail_after(timeout_s):
        async with anyio.create_task_group() as tg:
            for i in range(len(cases)):
                tg.start_soon(one, i)
    return out


async def assert_all_free(engine: Engine) -> None:
    """Every per-request thing any actor keeps is back to zero (pools back to their totals)."""
    res = await engine.resources()
    assert not leaks(res, engine.config.max_batch_size), res


async def aenumerate(it):
    n = 0
    async for x in it:
        yield n, x
        n += 1


async def wait_idle(engine: Engine) -> None:
    """Cancels are processed between steps, and releases sent during a step take effect at its end:
    wait until the scheduler holds no request and no step is in flight."""
    with anyio.fail_after(30):
        while (res := await engine.resources())["requests"] or res["steps_in_flight"]:
            await anyio.sleep(0.01)




SEEDED = [SamplingParams(temperature=0.9, top_p=0.95, seed=s, max_tokens=24) for s in (1, 2, 3)]


async def seeded_alone_and_batched(tiny, speculative: SpeculativeConfig | None, *, seeded: int = len(SEEDED),
                                   noise: int = 5, batch: int = 8, timeout_s: float = 60, **config: object
                                   ) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The first `seeded` SEEDED requests' outputs run one by one (batch 1), and run in a batch of
    `batch` beside `noise` unseeded requests of different lengths; a seed must give the same output
    both ways. `config`: more EngineConfig fields (the device runner's, say)."""
    async with Engine(tiny, EngineConfig(speculative=speculative, max_batch_size=1, **config)) as engine:  # type: ignore[arg-type]
        alone = [(await engine.complete("Once upon a time", grammar=JsonSchema(SCHEMA), sampling=p)).token_ids
                 for p in SEEDED[:seeded]]
    async with Engine(tiny, EngineConfig(speculative=speculative, max_batch_size=batch, **config)) as engine:  # type: ignore[arg-type]
        cases = [("Once upon a time", JsonSchema(SCHEMA), SEEDED[i]) for i in range(seeded)]
        cases += [(f"Noise {i}", None, SamplingParams(temperature=1.0, max_tokens=5 + 3 * i)) for i in range(noise)]
        batched = await complete_all(engine, cases, timeout_s=timeout_s)
        await wait_idle(engine)
        await assert_all_free(engine)
    return alone, [c.token_ids for c in batched[:seeded]]


def draft_spec(kind: str, tiny, k: int, **kw) -> SpeculativeConfig | None:
    """Draft-model configs on the tiny preset (int8 or float weights), by name, with K = k."""
    from interlock.drafters.model import DraftLM

    if kind == "none":
        return None
    if kind == "draft=target":
        return SpeculativeConfig(("draft",), max_draft_len=k, draft_lm=DraftLM.full(tiny.model), **kw)
    if kind == "self-draft":
        return SpeculativeConfig(("self-draft", "forced"), max_draft_len=k, self_draft_layers=1, **kw)
    if kind == "self-draft+ngram+adaptive":
        return SpeculativeConfig(("self-draft", "ngram", "forced"), max_draft_len=k, self_draft_layers=1,
                                 adaptive=True, **kw)
    if kind == "d2t-subset":        # a pruned vocabulary: every other id, plus the ones past 512
        d2t = torch.cat([torch.arange(0, 512, 2), torch.arange(512, tiny.tokenizer.vocab_size)])
        return SpeculativeConfig(("draft", "forced"), max_draft_len=k,
                                 draft_lm=DraftLM(tiny.model, 1).pruned(d2t), **kw)
    if kind == "d2t-permutation":   # the target itself over a shuffled vocabulary: a mapping bug shows
        d2t = torch.randperm(tiny.config.vocab_size, generator=torch.Generator().manual_seed(0))
        return SpeculativeConfig(("draft",), max_draft_len=k, draft_lm=DraftLM.full(tiny.model).pruned(d2t), **kw)
    raise ValueError(kind)


# --- switching grammars (test_switch_*engine.py, test_switch_forced.py) ------------------------
# The tiny preset's random model knows no marker, so its marker is its own first greedy token on
# SWITCH_PROMPT: it repeats that token, so n-gram drafts run straight across the switch.
SWITCH_PROMPT = "abc abc abc abc"
SWITCH_SCHEMA = {"type": "object", "properties": {"n": {"type": "boolean"}}, "required": ["n"]}


def first_greedy_token_text(tiny) -> str:
    async def first() -> int:
        async with Engine(tiny, EngineConfig(speculative=None, max_batch_size=1)) as engine:
            done = await engine.complete(SWITCH_PROMPT, sampling=SamplingParams(temperature=0.0, max_tokens=2))
            return done.token_ids[0]
    return tiny.tokenizer.decode([anyio.run(first)])


async def complete_switch(model, prompt, spec, mode: str | None, backend: str, sampling: SamplingParams, *,
                          draft_len: int = 3, max_batch_size: int = 2):
    """One request through a fresh engine with `mode`'s drafters (None: no speculation) on `backend`."""
    speculative = None if mode is None else SpeculativeConfig.parse(mode, max_draft_len=draft_len)
    config = EngineConfig(speculative=speculative, grammar=GrammarConfig(backend=backend),
                          max_batch_size=max_batch_size)
    async with Engine(model, config) as engine:
        with anyio.fail_after(300):
            return await engine.complete(prompt, grammar=spec, sampling=sampling)
