"""Prefix caching and the suffix drafter through the engine (tiny preset).

The cache changes what is prefilled, never what is emitted: greedy outputs are the same token for
token with and without it, in every speculative mode, grammar on and off, with CFG; a repeated
prompt reports its cached tokens; after any mix of finishes, cancels and failures every block is
free or cached (never held), and eviction under pressure corrupts nothing in use (outputs stay the
same). Small blocks and prefill chunks make short prompts share blocks and start mid-chunk.
"""
from __future__ import annotations

import random
from contextlib import aclosing

import anyio
import pytest

from interlock.engine import Engine, EngineConfig
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from helpers import GRAMMARS, SCHEMA, aenumerate, assert_all_free, complete_all, wait_idle

BLOCK, CHUNK = 4, 8
HEAD = "You extract one record from the text below and answer with JSON only. Text: "
TEXTS = ["Ann is 31.", "Bob, aged 40, lives here.", "Cy turned 7 today", "Dee is twenty."]
MODES = {
    "none": None,
    "ngram+forced": SpeculativeConfig(("ngram", "forced"), max_draft_len=3),
    "suffix+forced": SpeculativeConfig(("suffix", "forced"), max_draft_len=3),
    "self-draft+forced": SpeculativeConfig(("self-draft", "forced"), max_draft_len=3, self_draft_layers=1),
}
Case = tuple[str, object, SamplingParams, object]


def cases(cfg: bool = False) -> list[Case]:
    """Prompts sharing a long head, each grammar on and off; with cfg, a negative prompt too."""
    out: list[Case] = []
    for i, text in enumerate(TEXTS):
        for grammar in (GRAMMARS[i % len(GRAMMARS)], None):
            scale = 1.5 if cfg else None
            negative = HEAD + "Write badly." if cfg else None
            out.append((HEAD + text, grammar, SamplingParams(max_tokens=16, guidance_scale=scale), negative))
    return out


async def run_waves(tiny, speculative, requests: list[Case], waves: int = 2, **kw):
    """The requests side by side, `waves` times over on one engine (later waves hit the cache)."""
    config = EngineConfig(speculative=speculative, max_batch_size=4, block_size=BLOCK, prefill_chunk=CHUNK, **kw)
    out: list[list[tuple[int, ...]]] = []
    async with Engine(tiny, config) as engine:
        for _ in range(waves):
            out.append([c.token_ids for c in await complete_all(engine, requests, timeout_s=300)])
        await wait_idle(engine)
        await assert_all_free(engine)
        metrics = await engine.metrics()
        res = await engine.resources()
    return out, metrics, res


@pytest.mark.parametrize("mode", list(MODES))
async def test_outputs_identical_with_and_without_the_cache(tiny, mode: str) -> None:
    requests = cases()
    plain, m_off, _ = await run_waves(tiny, MODES[mode], requests, prefix_caching=False)
    cached, m_on, res = await run_waves(tiny, MODES[mode], requests, prefix_caching=True)
    assert plain[0] == plain[1]                   # greedy: the same requests give the same outputs
    assert cached == plain
    assert m_off.cached_prompt_tokens == 0 and m_on.cached_prompt_tokens > 0
    assert m_on.prompt_tokens == m_off.prompt_tokens
    assert res["kv_cached_blocks"] > 0 and res["kv_free_blocks"] == res["kv_total_blocks"]


@pytest.mark.parametrize("mode", ["none", "ngram+forced"])
async def test_cfg_outputs_identical_with_and_without_the_cache(tiny, mode: str) -> None:
    requests = cases(cfg=True)
    plain, _, _ = await run_waves(tiny, MODES[mode], requests, prefix_caching=False)
    cached, m_on, _ = await run_waves(tiny, MODES[mode], requests, prefix_caching=True)
    assert cached == plain and m_on.cached_prompt_tokens > 0


async def test_a_repeated_prompt_reports_its_cached_tokens(tiny) -> None:
    prompt = HEAD + TEXTS[1]
    config = EngineConfig(speculative=MODES["ngram+forced"], block_size=BLOCK, prefill_chunk=CHUNK)
    async with Engine(tiny, config) as engine:
        n = len(engine.intake.encode(prompt))
        first = await engine.complete(prompt, grammar=JsonSchema(SCHEMA), sampling=SamplingParams(max_tokens=16))
        m1 = await engine.metrics()
        second = await engine.complete(prompt, grammar=JsonSchema(SCHEMA), sampling=SamplingParams(max_tokens=16))
        m2 = await engine.metrics()
        await assert_all_free(engine)
    assert m1.cached_prompt_tokens == 0 and m1.prompt_tokens == n
    # every full block before the prompt's last token was committed by the first request
    assert m2.cached_prompt_tokens - m1.cached_prompt_tokens == (n - 1) // BLOCK * BLOCK > 0
    assert second.token_ids == first.token_ids


async def test_finish_cancel_and_failure_under_eviction_leave_every_block_free_or_cached(tiny) -> None:
    """A pool of a few requests' worth: cached blocks are evicted to admit new prompts while
    others are in use; outputs match the cache-off run, and refcounts agree with the block tables
    (checked by every engine.resources() call, polled throughout)."""
    rng = random.Random(7)
    prompts = [HEAD[: 30 + 7 * j] + t for j in range(3) for t in TEXTS]
    plan = [(rng.randrange(len(prompts)), rng.choice([None, None, 0, 2]), rng.random() < 0.1) for _ in range(60)]
    bad = JsonSchema({"type": "object", "properties": {"a": {"type": "no-such-type"}}})

    async def run(prefix_caching: bool):
        config = EngineConfig(speculative=MODES["ngram+forced"], max_batch_size=4, block_size=BLOCK,
                              prefill_chunk=CHUNK, num_kv_blocks=48, prefix_caching=prefix_caching)
        done: dict[int, tuple[int, ...]] = {}
        failed: list[BaseException] = []
        checks = 0
        async with Engine(tiny, config) as engine:
            finished = anyio.Event()

            async def one(i: int) -> None:
                p, cancel_after, fail = plan[i]
                grammar = bad if fail else GRAMMARS[p % len(GRAMMARS)]
                ids: list[int] = []
                try:
                    async with aclosing(engine.generate(prompts[p], grammar=grammar,
                                                        sampling=SamplingParams(max_tokens=12))) as stream:
                        async for n, delta in aenumerate(stream):
                            if cancel_after is not None and n >= cancel_after:
                                return
                            ids.extend(delta.token_ids)
                except GrammarError as exc:
                    failed.append(exc)
                    return
                done[i] = tuple(ids)

            async def poll() -> None:
                nonlocal checks
                while not finished.is_set():
                    res = await engine.resources()          # the KVActor checks its invariants here
                    assert res["kv_free_blocks"] <= res["kv_total_blocks"]
                    checks += 1
                    await anyio.sleep(0.005)

            with anyio.fail_after(300):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(poll)
                    async with anyio.create_task_group() as reqs:
                        for i in range(len(plan)):
                            reqs.start_soon(one, i)
                    finished.set()
            await wait_idle(engine)
            await assert_all_free(engine)
            res, metrics = await engine.resources(), await engine.metrics()
        assert checks > 0
        return done, failed, res, metrics

    plain, plain_failed, _, _ = await run(False)
    cached, cached_failed, res, metrics = await run(True)
    assert len(cached_failed) == len(plain_failed) == sum(f for _, _, f in plan) > 0
    finished_both = set(plain) & set(cached)
    assert len(finished_both) > 20
    assert [i for i in sorted(finished_both) if cached[i] != plain[i]] == []
    assert metrics.cached_prompt_tokens > 0
    assert 0 < res["kv_cached_blocks"] <= res["kv_total_blocks"] == 48


async def test_suffix_drafts_change_nothing_and_only_the_bounded_global_trie_remains(tiny) -> None:
    requests = [(HEAD + t, g, SamplingParams(max_tokens=24), None) for t in TEXTS for g in (JsonSchema(SCHEMA), None)]
    spec = SpeculativeConfig(("suffix", "forced"), max_draft_len=3)
    plain, m_plain, _ = await run_waves(tiny, None, requests, waves=2)
    drafted, m_suffix, res = await run_waves(tiny, spec, requests, waves=2)
    assert drafted == plain
    assert m_suffix.steps < m_plain.steps                     # it did speculate
    assert res["suffix_requests"] == res["suffix_request_nodes"] == 0
    assert 0 < res["suffix_global_tokens"] <= spec.suffix.max_global_tokens and res["suffix_global_nodes"] > 0


def test_suffix_parses_as_a_drafter() -> None:
    spec = SpeculativeConfig.parse("suffix+forced", max_draft_len=4)
    assert spec is not None and spec.drafters == ("suffix", "forced") and spec.label == "suffix+forced"


@pytest.mark.parametrize("mode", ["none", "ngram+forced"])
async def test_repetition_penalty_sees_the_cached_part_of_the_prompt(tiny, mode: str) -> None:
    """A prompt served from the cache is never forwarded, yet its ids are "in the prompt" for the
    repetition penalty: a strong penalty gives the same greedy output cached or not. The prompt ends
    with the model's own unpenalized continuation, so the ids the penalty must push down are in
    the cached part."""
    head = HEAD + TEXTS[0]
    penalized = SamplingParams(max_tokens=24, repetition_penalty=8.0)

    async def twice(prompt, prefix_caching: bool) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        config = EngineConfig(speculative=MODES[mode], block_size=BLOCK, prefill_chunk=CHUNK,
                              prefix_caching=prefix_caching)
        async with Engine(tiny, config) as engine:
            first = await engine.complete(prompt, sampling=penalized)
            second = await engine.complete(prompt, sampling=penalized)
            cached = (await engine.metrics()).cached_prompt_tokens
            await assert_all_free(engine)
        return first.token_ids, second.token_ids, cached

    async with Engine(tiny, EngineConfig(block_size=BLOCK, prefill_chunk=CHUNK)) as engine:
        prompt = list(engine.intake.encode(head))
        prompt += (await engine.complete(prompt, sampling=SamplingParams(max_tokens=24))).token_ids
    first, second, cached = await twice(prompt, True)
    cold_first, cold_second, no_cache = await twice(prompt, False)
    assert cached >= len(prompt) - BLOCK - 1 and no_cache == 0          # the second request hit the cache
    assert first == cold_first == cold_second
    assert second == first


@pytest.mark.parametrize("rows_prefill", [False, True])
async def test_a_cache_hit_gives_bit_identical_logprobs_through_either_prefill_path(tiny, rows_prefill: bool) -> None:
    """Prefill chunks longer than the row path's threshold (here 32 tokens) go through the bf16
    GEMM, whose rounding depends on its row count, unless the model prefills on the rows path
    (rows_prefill). Dense: hits are rounded down to whole chunks, so a prompt that hits the cache
    computes exactly the chunks a cold prefill computes; rows: any chunking computes the same
    bits, so hits are whole blocks. Either way: the same logprobs, bit for bit."""
    from interlock.kernels import native

    if rows_prefill and not native.available():
        pytest.skip("no C++ compiler: no rows path")
    config = dict(block_size=BLOCK, prefill_chunk=32)
    sampling = SamplingParams(max_tokens=6, logprobs=3)
    shared = HEAD * 2                                  # > 2 chunks of tokens in common
    prompts = [shared + TEXTS[0], shared + TEXTS[1]]

    async def run(prefix_caching: bool):
        async with Engine(tiny, EngineConfig(prefix_caching=prefix_caching, prefill=prefill, **config)) as engine:
            out = [await engine.complete(p, sampling=sampling) for p in prompts]
            cached = (await engine.metrics()).cached_prompt_tokens
            n_shared = len(engine.intake.encode(shared))
        return out, cached, n_shared

    prefill = "rows" if rows_prefill else "dense"
    warm, cached, n_shared = await run(True)
    cold, none_cached, _ = await run(False)
    assert none_cached == 0 and cached > 0 and cached % (BLOCK if rows_prefill else 32) == 0 and cached <= n_shared
    if rows_prefill:
        assert cached % 32 != 0                        # some hit ended inside a chunk
    for hit, ref in zip(warm, cold):
        assert hit.token_ids == ref.token_ids
        assert [(t.logprob, t.top) for t in hit.logprobs] == [(t.logprob, t.top) for t in ref.logprobs]


@pytest.mark.parametrize("rows_prefill", [True, False])
async def test_a_hit_starts_mid_chunk_when_prompt_chunks_take_the_rows_path(tiny, rows_prefill: bool) -> None:
    """Chunks of 32 tokens, above the dense path's threshold: with prompt chunks on the
    batch-invariant rows path a hit covers every whole block two prompts share, else only whole
    chunks (the dense path rounds a row by its chunk). Either way the output is a cold engine's."""
    from dataclasses import replace

    from interlock.kernels import native

    if rows_prefill and not native.available():
        pytest.skip("no C++ compiler: no rows path")
    first, second = HEAD + TEXTS[1], HEAD + TEXTS[2]
    sampling = SamplingParams(max_tokens=16)
    config = EngineConfig(speculative=MODES["ngram+forced"], block_size=BLOCK, prefill_chunk=32,
                          prefill="rows" if rows_prefill else "dense")
    async with Engine(tiny, config) as engine:
        a, b = engine.intake.encode(first), engine.intake.encode(second)
        shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        await engine.complete(first, grammar=JsonSchema(SCHEMA), sampling=sampling)
        m1 = await engine.metrics()
        got = await engine.complete(second, grammar=JsonSchema(SCHEMA), sampling=sampling)
        m2 = await engine.metrics()
        await assert_all_free(engine)
    async with Engine(tiny, replace(config, prefix_caching=False)) as cold:
        want = await cold.complete(second, grammar=JsonSchema(SCHEMA), sampling=sampling)
    unit = BLOCK if rows_prefill else 32
    assert m2.cached_prompt_tokens - m1.cached_prompt_tokens == shared // unit * unit
    assert shared % 32 >= BLOCK               # so the two cases differ: a hit inside the second chunk
    assert got.token_ids == want.token_ids


@pytest.mark.parametrize("rows_prefill", [False, True])
async def test_a_follow_up_that_repeats_an_output_gets_a_cold_prefills_bits(tiny, rows_prefill: bool) -> None:
    """Multi-turn: the next prompt is the last prompt + its output + more. The output's K/V came
    from decode / verify rows; a cold engine prefills those tokens as a prompt chunk. On the rows
    path both compute the same bits, so the hit may cover them; on the dense path the chunk's GEMM
    rounds differently, so only blocks a whole prefill chunk computed may be shared."""
    from interlock.kernels import native

    if rows_prefill and not native.available():
        pytest.skip("no C++ compiler: no rows path")
    config = dict(block_size=BLOCK, prefill_chunk=32, prefill="rows" if rows_prefill else "dense")
    sampling = SamplingParams(max_tokens=40, ignore_eos=True, logprobs=2)
    first = HEAD + TEXTS[0]

    async def run(prefix_caching: bool):
        async with Engine(tiny, EngineConfig(prefix_caching=prefix_caching, **config)) as engine:
            a = await engine.complete(first, sampling=sampling)
            follow = engine.intake.encode(first) + list(a.token_ids) + engine.intake.encode(" And again:")
            b = await engine.complete(follow, sampling=sampling)
            cached = (await engine.metrics()).cached_prompt_tokens
            await assert_all_free(engine)
        return a, b, cached, len(engine.intake.encode(first))

    warm_a, warm_b, cached, n_first = await run(True)
    cold_a, cold_b, _, _ = await run(False)
    assert warm_a.token_ids == cold_a.token_ids
    if rows_prefill:
        assert cached > n_first                        # the hit reaches into the first output
    assert warm_b.token_ids == cold_b.token_ids
    assert [(t.logprob, t.top) for t in warm_b.logprobs] == [(t.logprob, t.top) for t in cold_b.logprobs]


async def test_prefill_option_is_checked_and_sets_the_path(tiny) -> None:
    from interlock.kernels import native

    with pytest.raises(ValueError, match="prefill"):
        EngineConfig(prefill="fast")
    model_setting = tiny.model.rows_prefill
    for prefill, want in (("dense", False), ("auto", tiny.model.rows_prefill_default)):
        async with Engine(tiny, EngineConfig(prefill=prefill)) as engine:
            assert engine.rows_prefill is want
    if native.available():
        async with Engine(tiny, EngineConfig(prefill="rows")) as engine:
            assert engine.rows_prefill is True
    assert tiny.model.rows_prefill is model_setting       # the engine passes its path per batch


async def test_engines_sharing_a_model_keep_their_own_prompt_paths(tiny) -> None:
    # The engines once set the shared model's path: a second engine switched the first one's prompts.
    from interlock.kernels import native

    if not native.available() or tiny.model.fused_rows is None:
        pytest.skip("the rows prompt path needs the native kernels")
    prompt = list(range(3, 60))
    sampling = SamplingParams(temperature=0.0, max_tokens=4, logprobs=2)

    async def first_logprobs(engine: Engine) -> list:
        c = await engine.complete(prompt, sampling=sampling)
        return [(lp.token_id, lp.logprob, lp.top) for lp in c.logprobs]

    async with Engine(tiny, EngineConfig(prefill="dense", speculative=None)) as alone:
        dense = await first_logprobs(alone)
    async with Engine(tiny, EngineConfig(prefill="rows", speculative=None)) as alone:
        rows = await first_logprobs(alone)
    assert dense != rows                                # the two paths round differently: tellable apart
    async with Engine(tiny, EngineConfig(prefill="dense", speculative=None)) as a, \
            Engine(tiny, EngineConfig(prefill="rows", speculative=None)) as b:
        assert await first_logprobs(a) == dense and await first_logprobs(b) == rows
