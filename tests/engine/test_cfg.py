"""Classifier-free guidance: s = 1 and a negative prompt equal to the prompt change nothing; CFG
with speculation equals CFG without under greedy, grammar on and off; a request and its companion
are admitted, planned, rewound and freed together (tiny preset). The distributional check of
stochastic CFG with speculation is in test_cfg_stats.py."""
from __future__ import annotations

import json
from contextlib import aclosing
from dataclasses import replace

import anyio
import pytest
import torch

from interlock.actors.verifier_actor import VerifierActor
from interlock.engine import Engine, EngineConfig
from interlock.kernels.cfg import cfg_combine
from interlock.protocol.errors import GrammarError, KVCacheExhaustedError, RequestError
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import Completion, SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from helpers import GRAMMARS, PROMPTS, SCHEMA, aenumerate, assert_all_free, complete_all, wait_idle

K = 3
NGRAM = SpeculativeConfig(("ngram", "forced"), max_draft_len=K)
SELF_DRAFT = SpeculativeConfig(("self-draft", "forced"), max_draft_len=K, self_draft_layers=1)
NEGATIVE = [None, "Write badly.", [{"role": "user", "content": "Say nothing useful."}]]

Request = tuple[str, object, SamplingParams, object]      # prompt, grammar, sampling, negative prompt


def cases(n: int, scale: float | None, **sampling) -> list[Request]:
    """n (prompt, grammar) cases, every grammar on and off, with rotating negative prompts."""
    return [(PROMPTS[i % len(PROMPTS)], GRAMMARS[i % len(GRAMMARS)],
             SamplingParams(max_tokens=20, guidance_scale=scale, **sampling),
             NEGATIVE[i % len(NEGATIVE)] if scale is not None else None) for i in range(n)]


async def run(tiny, speculative: SpeculativeConfig | None, requests: list[Request], **config) -> list[Completion]:
    """Every request side by side on one engine; completions in request order; checks nothing leaked."""
    async with Engine(tiny, EngineConfig(speculative=speculative, max_batch_size=8, **config)) as engine:
        out = await complete_all(engine, requests)
        await wait_idle(engine)
        await assert_all_free(engine)
    return out


def ids(completions: list[Completion]) -> list[tuple[int, ...]]:
    return [c.token_ids for c in completions]


@pytest.mark.parametrize("speculative", [None, NGRAM], ids=["plain", "ngram+forced"])
async def test_scale_one_gives_the_output_without_guidance(tiny, speculative) -> None:
    seeded = dict(temperature=0.9, top_p=0.95, seed=5)
    plain = cases(8, None) + cases(4, None, **seeded)
    guided = cases(8, 1.0) + cases(4, 1.0, **seeded)
    assert ids(await run(tiny, speculative, guided)) == ids(await run(tiny, speculative, plain))


async def test_negative_prompt_equal_to_the_prompt_gives_the_unguided_output(tiny) -> None:
    # The companion then computes the request's own logits bit for bit (same code path), so
    # u + s * (c - u) = c for any s: a check that its rows are computed like the request's.
    plain = cases(8, None)
    same = [(p, g, replace(s, guidance_scale=4.0), p) for p, g, s, _ in plain]
    assert ids(await run(tiny, NGRAM, same)) == ids(await run(tiny, NGRAM, plain))


@pytest.mark.parametrize("scale", [3.0, 0.0, -0.5])
@pytest.mark.parametrize("speculative", [NGRAM, SELF_DRAFT], ids=["ngram+forced", "self-draft+forced"])
async def test_cfg_with_speculation_equals_cfg_without_under_greedy(tiny, speculative, scale: float) -> None:
    # Mixed with unguided requests in the same batch; grammars on and off (GRAMMARS holds None).
    requests = cases(8, scale) + cases(4, None)
    without = await run(tiny, None, requests)
    with_spec = await run(tiny, speculative, requests)
    assert ids(with_spec) == ids(without)
    assert sum(c.stats.steps for c in with_spec) < sum(c.stats.steps for c in without)
    unguided = await run(tiny, None, cases(8, None))
    assert ids(without[:8]) != ids(unguided), "guidance should change some output"
    for (_, grammar, _, _), c in zip(requests, with_spec):
        if isinstance(grammar, JsonSchema) and c.finish_reason == "stop":
            import jsonschema

            jsonschema.validate(json.loads(c.text), SCHEMA)


def test_guided_rows_follow_the_formula_and_scale_one_is_the_cond_rows_bitwise() -> None:
    gen = torch.Generator().manual_seed(3)
    cond, uncond = torch.randn(4, 50, generator=gen), torch.randn(4, 50, generator=gen)
    assert torch.equal(VerifierActor._guided(cond, uncond, 1.0), cond)
    assert torch.equal(VerifierActor._guided(cond, uncond, None), cond)
    torch.testing.assert_close(VerifierActor._guided(cond, uncond, 2.0), 2 * cond - uncond)
    assert torch.equal(VerifierActor._guided(cond, uncond, 2.0), cfg_combine(cond, uncond, torch.full((4,), 2.0)))


# --- the pair in the scheduler -------------------------------------------------------------------

@pytest.fixture
def plans(monkeypatch) -> list:
    """Every StepPlan the verifier forwards (recorded on the model lane)."""
    seen: list = []
    forward = VerifierActor.forward

    def spy(self) -> None:
        seen.append(self._work.plan)
        forward(self)

    monkeypatch.setattr(VerifierActor, "forward", spy)
    return seen


async def test_a_request_and_its_companion_step_together(tiny, plans) -> None:
    # prefill_chunk 16: the companion's prompt (the chat template, ~50 tokens) prefills over several
    # steps while the request's own short prompt is done after one; the pair samples only after both.
    requests = cases(6, 2.0) + cases(2, None)
    await run(tiny, NGRAM, requests, prefill_chunk=16)
    lengths = {}
    for prompt, _, sampling, negative in requests:
        if sampling.guidance_scale is not None:
            uncond = tiny.tokenizer.encode_prompt(negative if negative is not None else [{"role": "user", "content": ""}])
            lengths[prompt, json.dumps(negative)] = (len(tiny.tokenizer.encode_prompt(prompt)), len(uncond))
    gaps = {u - c for c, u in lengths.values()}
    sampled = 0
    for plan in plans:
        seqs = {seq for seq, _ in plan.kv.tables}
        for s in plan.snapshots:
            if s.sampling.guidance_scale is None:
                assert s.guide is None
                continue
            assert s.guide is not None and s.guide.seq in seqs and s.seq in seqs
            if s.sample:                # fed in step: one token each, positions a constant gap apart
                sampled += 1
                assert len(s.chunk) == len(s.guide.chunk) == 1
                assert s.guide.start - s.start in gaps
                # each holds the blocks of its committed positions + this step's rows (K drafts and
                # the rows forced tokens may add), no more: the companion was rewound with the request
                assert plan.max_drafts == NGRAM.step_drafts
                for seq, start in ((s.seq, s.start), (s.guide.seq, s.guide.start)):
                    assert len(plan.kv.block_table(seq)) == -(-(start + 1 + plan.max_drafts) // 16)
            else:
                assert s.chunk or s.guide.chunk
    assert sampled > 0
    assert any(not s.sample and not s.chunk for plan in plans for s in plan.snapshots), \
        "some step should prefill only a companion"


def _pair_blocks(tiny, prompt: str, max_tokens: int) -> tuple[int, int]:
    """(blocks of the request alone, blocks of the request and its default companion)."""
    per = lambda n: -(-(n + max_tokens + K + 1) // 16)      # noqa: E731
    cond = per(len(tiny.tokenizer.encode_prompt(prompt)))
    return cond, cond + per(len(tiny.tokenizer.encode_prompt([{"role": "user", "content": ""}])))


async def test_pairs_are_admitted_whole_and_wait_for_blocks(tiny, plans) -> None:
    # A pool with room for one pair (not two): the pairs run one after another, none half-admitted.
    sampling = SamplingParams(max_tokens=20, guidance_scale=2.0)
    _, pair = _pair_blocks(tiny, PROMPTS[0], 20)
    requests = [(PROMPTS[0], g, sampling, None) for g in GRAMMARS[:3]]
    done = await run(tiny, NGRAM, requests, num_kv_blocks=pair + 1)
    assert all(c.finish_reason in ("stop", "length") for c in done)
    assert max(sum(s.guide is not None for s in plan.snapshots) for plan in plans) == 1
    assert ids(done) == ids(await run(tiny, NGRAM, requests))      # waiting changed nothing


async def test_a_pair_that_cannot_fit_fails_alone(tiny) -> None:
    cond, pair = _pair_blocks(tiny, PROMPTS[0], 20)
    async with Engine(tiny, EngineConfig(speculative=NGRAM, max_batch_size=2, num_kv_blocks=pair - 1)) as engine:
        with pytest.raises(KVCacheExhaustedError, match="companion"):
            await engine.complete(PROMPTS[0], sampling=SamplingParams(max_tokens=20, guidance_scale=2.0))
        assert cond <= pair - 1
        await engine.complete(PROMPTS[0], sampling=SamplingParams(max_tokens=20))
        await wait_idle(engine)
        await assert_all_free(engine)


async def test_cancelled_and_failed_pairs_free_both_sequences(tiny) -> None:
    sampling = SamplingParams(max_tokens=200, ignore_eos=True, guidance_scale=2.0)
    finished: list[int] = []
    async with Engine(tiny, EngineConfig(speculative=NGRAM, max_batch_size=4, prefill_chunk=16)) as engine:

        async def read(i: int) -> None:
            leave_after = [0, 2, None][i % 3]           # deltas read before leaving; None: to the end
            sp = sampling if leave_after is not None else replace(sampling, max_tokens=12)
            async with aclosing(engine.generate(PROMPTS[i % len(PROMPTS)], sampling=sp,
                                                negative_prompt=NEGATIVE[i % len(NEGATIVE)])) as stream:
                async for n, _ in aenumerate(stream):
                    if leave_after is not None and n >= leave_after:
                        return
            finished.append(i)

        async def cancelled_early(i: int) -> None:     # queued or prefilling, whichever it reached
            async with aclosing(engine.generate(PROMPTS[i], sampling=sampling)) as stream:
                with anyio.move_on_after(0.01 * i):
                    await stream.__anext__()

        async def bad_grammar() -> None:
            with pytest.raises(GrammarError):
                await engine.complete("x", sampling=replace(sampling, ignore_eos=False), grammar=JsonSchema(
                    {"type": "object", "properties": {"a": {"type": "no-such-type"}}}))

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for i in range(9):
                    tg.start_soon(read, i)
                for i in range(3):
                    tg.start_soon(cancelled_early, i)
                tg.start_soon(bad_grammar)
        await wait_idle(engine)
        await assert_all_free(engine)
    assert sorted(finished) == [2, 5, 8]


async def test_bad_guidance_arguments_raise_request_errors(tiny) -> None:
    with pytest.raises(RequestError):
        SamplingParams(guidance_scale=float("nan"))
    async with Engine(tiny, EngineConfig(speculative=NGRAM, max_batch_size=2)) as engine:
        with pytest.raises(RequestError, match="guidance_scale"):
            await engine.complete("x", negative_prompt="y")
        await assert_all_free(engine)


async def test_cli_generate_with_guidance(tiny) -> None:
    # In a subprocess: the CLI configures logging for its whole process.
    import sys

    prompt = "Once upon a time"
    plain = (await run(tiny, None, [([{"role": "user", "content": prompt}], None, SamplingParams(max_tokens=6), None)]))[0]
    args = [sys.executable, "-m", "interlock.cli", "generate", prompt, "--model", "tiny", "--max-tokens", "6"]
    for extra in (["--guidance-scale", "1"], ["--guidance-scale", "3", "--negative-prompt", prompt]):
        out = await anyio.run_process(args + extra, check=False)
        assert out.returncode == 0, out.stderr.decode()
        assert out.stdout.decode() == plain.text + "\n"      # s = 1, or uncond = cond: the unguided text
