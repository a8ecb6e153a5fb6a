"""SamplingParams.logprobs: each emitted token's log-probability under the masked target law it was
verified against, the same with every drafter as without speculation (greedy), and equal to the log
of the law a slow reference computes from the model directly (sampled, under speculation)."""
from __future__ import annotations

import math

import anyio
import pytest
import torch

from interlock.drafters.model import DraftLM
from interlock.engine import Engine, EngineConfig
from interlock.grammars.bitmask import allocate_bitmask
from interlock.kernels import apply_penalties, apply_token_bitmask_
from interlock.kernels.sampling_reference import probs_from_logits_reference
from interlock.models.batch import SeqChunk, build_batch
from interlock.models.kv_cache import PagedKVCache
from interlock.protocol.errors import InvalidParameterError
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import Completion, SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from helpers import GRAMMARS, PROMPTS, SCHEMA, assert_all_free, complete_all
from resources import DEVICE_CONTEXT

K = 3
SPECS = {
    "ngram+forced": lambda tiny: SpeculativeConfig(("ngram", "forced"), max_draft_len=K),
    "suffix+forced": lambda tiny: SpeculativeConfig(("suffix", "forced"), max_draft_len=K),
    "self-draft+forced": lambda tiny: SpeculativeConfig(("self-draft", "forced"), max_draft_len=K,
                                                        self_draft_layers=1),
    "draft=target": lambda tiny: SpeculativeConfig(("draft",), max_draft_len=K, draft_lm=DraftLM.full(tiny.model)),
}


async def run(tiny, speculative, cases, runner: str = "auto") -> list[Completion]:
    async with Engine(tiny, EngineConfig(speculative=speculative, max_batch_size=8, runner=runner,
                                         max_context=DEVICE_CONTEXT)) as engine:
        out = await complete_all(engine, cases)
        await assert_all_free(engine)
    return out


def greedy_cases(n_top: int = 3) -> list:
    plain = [(PROMPTS[i % len(PROMPTS)], GRAMMARS[i % len(GRAMMARS)], SamplingParams(max_tokens=20, logprobs=n_top))
             for i in range(8)]
    # penalties (verify position j counts the drafts before it) and guidance change the rows: the
    # logprobs must follow them the same way with and without drafts
    return plain + [
        (PROMPTS[4], None, SamplingParams(max_tokens=20, logprobs=n_top, presence_penalty=0.5, repetition_penalty=1.3)),
        (PROMPTS[1], GRAMMARS[1], SamplingParams(max_tokens=20, logprobs=n_top, guidance_scale=1.5)),
    ]


def assert_same_logprobs(a: Completion, b: Completion) -> None:
    assert a.token_ids == b.token_ids
    assert a.logprobs is not None and b.logprobs is not None
    assert len(a.logprobs) == len(a.token_ids) == len(b.logprobs)
    for x, y in zip(a.logprobs, b.logprobs):
        assert x.token_id == y.token_id
        assert math.isclose(x.logprob, y.logprob, rel_tol=1e-4, abs_tol=1e-5)
        assert [t for t, _ in x.top] == [t for t, _ in y.top]
        assert all(math.isclose(p, q, rel_tol=1e-4, abs_tol=1e-5) for (_, p), (_, q) in zip(x.top, y.top))


@pytest.mark.parametrize("mode", list(SPECS))
def test_greedy_speculative_logprobs_equal_plain(tiny, mode: str) -> None:
    cases = greedy_cases()
    plain = anyio.run(run, tiny, None, cases)
    spec = anyio.run(run, tiny, SPECS[mode](tiny), cases)
    for a, b in zip(plain, spec):
        assert_same_logprobs(a, b)
        for lp in a.logprobs:
            # greedy: the token is the argmax of its row, so it heads its own alternatives
            assert lp.top[0][0] == lp.token_id and lp.logprob <= 0 and len(lp.top) <= 3
    assert sum(c.stats.drafted for c in spec) > 0                      # it did speculate


def test_off_by_default_and_zero_alternatives(tiny) -> None:
    cases = [(PROMPTS[0], None, SamplingParams(max_tokens=8)), (PROMPTS[0], None, SamplingParams(max_tokens=8, logprobs=0))]
    off, zero = anyio.run(run, tiny, SPECS["ngram+forced"](tiny), cases)
    assert off.logprobs is None
    assert zero.logprobs is not None and len(zero.logprobs) == len(zero.token_ids) == len(off.token_ids)
    assert all(lp.top == () for lp in zero.logprobs)


@pytest.mark.parametrize("bad", [-1, 21, 1.5, True, "3"])
def test_bad_logprobs_value_is_a_typed_error(bad) -> None:
    with pytest.raises(InvalidParameterError) as e:
        SamplingParams(logprobs=bad)
    assert e.value.field == "logprobs"


def decode_rows(tiny, prompt: list[int], tokens: tuple[int, ...]) -> torch.Tensor:
    """Target logits [len(tokens), V]: row i after prompt + tokens[:i], one token per forward as a
    plain decode computes them (a chunk of more than 16 tokens would take the fused attention path,
    whose rounding differs in the far tail: laws.logits_after is exact only for short prefixes)."""
    kv = PagedKVCache(tiny.config, num_blocks=64, block_size=16)
    kv.add_sequence(0)
    if len(prompt) > 1:
        kv.reserve(0, len(prompt) - 1)
        tiny.model(build_batch([SeqChunk(0, tuple(prompt[:-1]), 0, ())], kv), kv)
    rows = []
    for token in (prompt[-1], *tokens[:-1]):
        start = kv.reserve(0, 1)
        rows.append(tiny.model(build_batch([SeqChunk(0, (token,), start, (0,))], kv), kv)[0])
    return torch.stack(rows)


def reference_logprobs(tiny, engine: Engine, prompt: str, grammar, sampling: SamplingParams,
                       tokens: tuple[int, ...]) -> list[tuple[float, list[float], list[float]]]:
    """(log p(token), log p of every id, the largest log p's) per emitted token, from the model directly: the penalized,
    masked, temperature/top-k/top-p law of the slow reference kernels."""
    tok = tiny.tokenizer
    ids = tok.encode_prompt(prompt)
    matcher = anyio.run(engine.grammars.matcher, grammar)
    bitmask = allocate_bitmask(1, tiny.config.vocab_size)
    rows = decode_rows(tiny, ids, tokens)
    out = []
    for i, token in enumerate(tokens):
        x = rows[i: i + 1].clone()                                          # [1, V] after tokens[:i], model dtype
        counts = torch.zeros(1, x.shape[1], dtype=torch.long)
        counts[0].index_add_(0, torch.tensor(tokens[:i], dtype=torch.long), torch.ones(i, dtype=torch.long))
        seen = torch.zeros(1, x.shape[1], dtype=torch.bool)
        seen[0, ids] = True
        x = apply_penalties(x, counts, seen, torch.tensor([sampling.presence_penalty]),
                            torch.tensor([sampling.frequency_penalty]), torch.tensor([sampling.repetition_penalty]),
                            backend="reference").float()
        x[:, tok.vocab_size:] = float("-inf")
        matcher.fill_mask(bitmask, 0)
        apply_token_bitmask_(x, bitmask)
        assert matcher.accept([token])
        p = probs_from_logits_reference(x, torch.tensor([sampling.temperature]),
                                        torch.tensor([sampling.top_k or 0]), torch.tensor([sampling.top_p or 1.0]))[0]
        logp = [math.log(v) if v > 0 else -math.inf for v in p.tolist()]
        out.append((logp[token], logp, sorted(logp, reverse=True)[: sampling.logprobs]))
    return out


@pytest.mark.parametrize("mode", ["ngram+forced", "self-draft+forced"])
def test_sampled_logprobs_are_the_log_of_the_masked_law(tiny, mode: str) -> None:
    check_sampled_logprobs(tiny, SPECS[mode](tiny), "auto")


def test_sampled_logprobs_on_the_device_runner_are_the_log_of_the_masked_law(tiny_float) -> None:
    """The device runner's logprobs (kernels/verify_features.py, on captured steps) under the same check."""
    check_sampled_logprobs(tiny_float, SPECS["ngram+forced"](tiny_float), "device")


def check_sampled_logprobs(tiny, speculative: SpeculativeConfig, runner: str) -> None:
    grammar = JsonSchema(SCHEMA)
    cases = [("Once upon a time", grammar, SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=s,
                                                          max_tokens=24, logprobs=2)) for s in range(4)]
    cases.append(("Once upon a time", grammar, SamplingParams(temperature=0.9, seed=7, max_tokens=24, logprobs=2,
                                                              presence_penalty=0.4, frequency_penalty=0.3,
                                                              repetition_penalty=1.2)))
    got = anyio.run(run, tiny, speculative, cases, runner)
    assert sum(c.stats.drafted for c in got) > 0

    async def check() -> None:
        async with Engine(tiny, EngineConfig(speculative=None)) as engine:
            for (prompt, _, sampling), c in zip(cases, got):
                assert c.logprobs is not None and c.token_ids
                # the stop token ends the output and is not in it: check the tokens that are
                want = await anyio.to_thread.run_sync(reference_logprobs, tiny, engine, prompt, grammar, sampling,
                                                      c.token_ids)
                for lp, (logp, every, best) in zip(c.logprobs, want):
                    assert math.isclose(lp.logprob, logp, rel_tol=1e-3, abs_tol=1e-4), (lp, logp)
                    # alternatives: the most likely ids with their own log p (ids may swap on a tie)
                    assert len(lp.top) == len([v for v in best if v > -math.inf])
                    for (t, v), want_v in zip(lp.top, best):
                        assert math.isclose(v, every[t], rel_tol=1e-3, abs_tol=1e-4)
                        assert math.isclose(v, want_v, rel_tol=1e-3, abs_tol=1e-4)

    anyio.run(check)
