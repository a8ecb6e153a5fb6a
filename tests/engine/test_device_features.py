"""Classifier-free guidance, repetition penalties and logprobs on the device runner (the CUDA
engine's path; on the CPU under CUDA's rules, and again on CUDA when a GPU is present):

- the greedy output of each feature, and of all together, is the reference loop's
  (interlock.testing.greedy_reference: the features applied one token at a time, float32), with
  speculation and without, and the CPU engine's (the host runner) is the same;
- greedy speculative == greedy plain for every drafter, grammars on and off, logprobs included,
  and captured steps give the eager output;
- a request that uses no feature pays nothing for it: a step's shape names only the features its
  requests use (no companion rows, no penalty or logprob work otherwise), its neighbours' features
  do not change its output, and it replays the same captured program as without them.
The guided and penalized sampling laws are checked on the host runner (test_cfg_stats.py, test_penalties.py).
"""
from __future__ import annotations

import json
import math
from dataclasses import replace

import anyio
import jsonschema
import pytest
import torch

from interlock.actors.device.verifier import DeviceVerifier
from interlock.actors.device.feature_staging import FeatureShape
from interlock.engine import Engine, EngineConfig
from interlock.engine.intake import EMPTY_CHAT
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import Completion, SamplingParams, TokenLogprob
from interlock.protocol.speculative import SpeculativeConfig
from interlock.testing.greedy import greedy_reference

from helpers import GRAMMARS, PROMPTS, SCHEMA, assert_all_free, complete_all, wait_idle
from resources import DEVICE_CONTEXT

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                   reason="needs a CUDA device"))]
GREEDY = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
PENALTIES = dict(presence_penalty=0.5, frequency_penalty=1.5, repetition_penalty=1.3)
FEATURES: dict[str, tuple[SamplingParams, str | None]] = {      # sampling, negative prompt
    "plain": (GREEDY, None),
    "guidance": (replace(GREEDY, guidance_scale=2.5), "Write badly."),
    "guidance-default-negative": (replace(GREEDY, guidance_scale=-0.5), None),
    "guidance-scale-1": (replace(GREEDY, guidance_scale=1.0), "Write badly."),
    "penalties": (replace(GREEDY, **PENALTIES), None),
    "encouraging-penalties": (replace(GREEDY, presence_penalty=-0.6, frequency_penalty=-0.3,
                                      repetition_penalty=0.8), None),
    "logprobs": (replace(GREEDY, logprobs=3), None),
    "all": (replace(GREEDY, guidance_scale=1.5, logprobs=20, **PENALTIES), "Say nothing useful."),
}

Case = tuple[str, object, SamplingParams, str | None]        # prompt, grammar, sampling, negative prompt


def device_config(device: str, mode: str | SpeculativeConfig = "ngram+forced", **kw) -> EngineConfig:
    spec = mode if isinstance(mode, SpeculativeConfig) else SpeculativeConfig.parse(mode, max_draft_len=3)
    return EngineConfig(speculative=spec, runner="device", device=device, max_batch_size=8, max_context=DEVICE_CONTEXT,
                        **kw)


async def run(model, config: EngineConfig, cases: list[Case]) -> tuple[list[Completion], object]:
    """Every case side by side in one engine: completions in case order, and the engine's metrics."""
    async with Engine(model, config) as engine:
        out = await complete_all(engine, cases, timeout_s=300)
        await wait_idle(engine)
        await assert_all_free(engine)
        metrics = await engine.metrics()
    return out, metrics


Out = tuple[tuple[int, ...], tuple[TokenLogprob, ...] | None]       # token ids, logprobs


def out(c: Completion) -> Out:
    return c.token_ids, c.logprobs


def same(a: Out, b: Out, what: str) -> None:
    """The same tokens, and the same logprobs up to float rounding (ids equal, values close)."""
    assert a[0] == b[0], what
    assert (a[1] is None) == (b[1] is None), what
    for x, y in zip(a[1] or (), b[1] or ()):
        assert x.token_id == y.token_id and math.isclose(x.logprob, y.logprob, rel_tol=1e-4, abs_tol=1e-5), what
        assert [t for t, _ in x.top] == [t for t, _ in y.top], what
        assert all(math.isclose(p, q, rel_tol=1e-4, abs_tol=1e-5) for (_, p), (_, q) in zip(x.top, y.top)), what


def reference_cases() -> list[Case]:
    return [(PROMPTS[i % 2], None, sampling, negative)
            for name, (sampling, negative) in FEATURES.items() for i in range(2)]


@pytest.mark.parametrize("device", DEVICES)
async def test_greedy_output_of_each_feature_is_the_reference_loops(tiny_float, device: str) -> None:
    """On the CPU the reference is the float32 loop. On CUDA the engine computes in bf16, which cannot
    equal a float32 loop token for token (a near tie flips an argmax, logprobs differ past 1e-4): there
    the reference is the device runner's own eager, unspeculated output, and how close bf16 is to
    float32 is tests/models/test_device_forward.py's (`test_close_to_the_cpu_fp32_reference`)."""
    cases = reference_cases()
    tok = tiny_float.tokenizer
    want: list[Out] = []
    if device == "cuda":
        eager, _ = await run(tiny_float, device_config(device, "none", capture_steps=False), cases)
        want = [out(c) for c in eager]
    for prompt, _, sampling, negative in cases if device == "cpu" else ():
        neg = tok.encode_prompt(negative if negative is not None else EMPTY_CHAT)
        tokens, logprobs = await anyio.to_thread.run_sync(lambda: greedy_reference(
            tiny_float.model, tok.encode_prompt(prompt), sampling, negative=neg, vocab=tok.vocab_size))
        want.append((tuple(tokens), None if logprobs is None else tuple(logprobs)))
    names = [name for name in FEATURES for _ in range(2)]
    runs = {"device, plain": device_config(device, "none"), "device, ngram+forced": device_config(device)}
    if device == "cpu":
        runs["the CPU engine"] = EngineConfig(speculative=SpeculativeConfig.parse("ngram+forced", max_draft_len=3),
                                              max_batch_size=8)
    for run_name, config in runs.items():
        got, _ = await run(tiny_float, config, cases)
        for name, g, w in zip(names, got, want):
            same(out(g), w, f"{name} on {run_name}")
    for i, (name, w) in enumerate(zip(names, want)):   # the features change the output (scale 1 does not)
        if name in ("guidance", "guidance-default-negative", "penalties", "all", "guidance-scale-1"):
            assert (w[0] == want[i % 2][0]) == (name == "guidance-scale-1"), name


class Oracle:
    """A user drafter that proposes the rest of a plain output its request's tokens start (else junk)."""

    def __init__(self, sequences: list[tuple[int, ...]]) -> None:
        self.sequences = sequences             # prompt + plain output, one per case

    def propose(self, requests, k):
        out = []
        for r in requests:
            n = len(r.tokens)
            known = next((s for s in self.sequences if len(s) > n and s[:n] == tuple(r.tokens)), None)
            out.append(list(known[n: n + k]) if known is not None else [7] * k)
        return out


def mixed_cases(n: int) -> list[Case]:
    """Features side by side with plain requests, grammars on and off (GRAMMARS holds None)."""
    names = ["guidance", "penalties", "logprobs", "all", "plain", "encouraging-penalties"]
    cases = []
    for i in range(n):
        sampling, negative = FEATURES[names[i % len(names)]]
        cases.append((PROMPTS[i % len(PROMPTS)], GRAMMARS[i % len(GRAMMARS)],
                      replace(sampling, max_tokens=16, ignore_eos=False), negative))
    return cases


@pytest.mark.parametrize("device", DEVICES)
async def test_greedy_speculative_equals_greedy_plain_with_features(tiny_float, device: str) -> None:
    cases = mixed_cases(12)
    plain, _ = await run(tiny_float, device_config(device, "none"), cases)
    tok = tiny_float.tokenizer
    oracle = Oracle([tuple(tok.encode_prompt(p)) + c.token_ids for (p, *_), c in zip(cases, plain)])
    runs = {"ngram+forced": device_config(device),
            "ngram+forced, eager": device_config(device, capture_steps=False),
            "user oracle": device_config(device, SpeculativeConfig(drafters=("forced",), user_drafter=oracle,
                                                                   max_draft_len=3))}
    for name, config in runs.items():
        got, metrics = await run(tiny_float, config, cases)
        for i, (want, have) in enumerate(zip(plain, got)):
            same(out(have), out(want), f"{name} differs on case {i}")
            assert have.finish_reason == want.finish_reason
        assert sum(c.stats.accepted for c in got) > 0, f"{name} accepted no draft"
        if config.capture_steps:
            assert metrics.replayed_steps > 0, metrics
    for (_, grammar, *_), c in zip(cases, plain):
        if isinstance(grammar, JsonSchema) and c.finish_reason == "stop":
            jsonschema.validate(json.loads(c.text), SCHEMA)


@pytest.mark.parametrize("device", DEVICES)
async def test_a_request_without_features_pays_nothing_for_them(tiny_float, device: str, monkeypatch) -> None:
    """Steps whose requests use no feature have the featureless shape (no companion rows, no
    penalty or logprob work: the program of an engine that never saw a feature); a step's shape
    names only what its requests use; one program per step; and the features beside a request do
    not change its output."""
    seen: list[tuple[object, object, int]] = []             # (shape, plan, logits rows) of each step
    forward = DeviceVerifier.forward

    def spy(self, shape=None) -> None:
        forward(self, shape)
        seen.append((shape, self._dwork.plan, self._logits.shape[0]))

    monkeypatch.setattr(DeviceVerifier, "forward", spy)
    plain_cases = [(f"Once upon a time {i}", None, replace(GREEDY, max_tokens=24), None) for i in range(3)]
    alone, _ = await run(tiny_float, device_config(device), plain_cases)
    featureless = {shape for shape, _, _ in seen}
    assert all(shape.features == FeatureShape() for shape in featureless)
    seen.clear()
    featured = [(p, g, replace(s, max_tokens=8), n) for p, g, s, n in mixed_cases(4) if s is not GREEDY][:3]
    beside, metrics = await run(tiny_float, device_config(device), plain_cases + featured)
    assert [c.token_ids for c in beside[:3]] == [c.token_ids for c in alone], "a neighbour's features leaked"
    assert metrics.replayed_steps + metrics.eager_steps == metrics.steps, metrics
    k1 = device_config(device).speculative.step_drafts + 1             # verify rows per request
    for shape, plan, rows in seen:
        sampled = [s for s in plan.snapshots if s.sample]
        guided = sum(s.guide is not None for s in sampled)
        want_guides = next(b for b in (1, 2, 4, 8) if b >= guided) if guided and shape.graph else guided
        assert shape.features.guides == want_guides, shape
        assert shape.features.penalties == any(s.sampling.penalized for s in sampled), shape
        assert (shape.features.logprobs is None) == all(s.sampling.logprobs is None for s in sampled), shape
        assert rows == (shape.batch + shape.features.guides) * k1, shape      # logits: verify rows only
        if shape.graph:
            assert shape.rows == (shape.batch + shape.features.guides) * k1, shape
            if shape.features == FeatureShape():
                assert shape in featureless or shape.batch not in {s.batch for s in featureless}
    assert any(shape.features == FeatureShape() and shape.graph for shape, _, _ in seen), \
        "the plain requests outlive the featured ones: their last steps are featureless"
