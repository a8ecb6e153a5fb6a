"""Qwen3, Gemma 3, Phi-3 and Phi-4-mini through the engine (tiny random-weight checkpoints built with
transformers, testing/families.py; the CPU engine's int8 weights):

- speculation changes speed, never output: greedy constrained output is the same token for token
  with every drafter (n-gram, suffix, forced, self-draft, a draft checkpoint) as without speculation;
- prefix caching changes what is prefilled, never what is emitted, also where a sliding window has
  moved past the cached blocks (Gemma 3's 8-key window, Phi-3's 16 keys, 4-token blocks);
- the Reasoning grammar takes its markers from the tokenizer, and a chat template with Qwen3's
  enable_thinking switch is rendered with thinking on exactly for Reasoning requests.
"""
from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from helpers import SCHEMA, assert_all_free, complete_all, wait_idle
from resources import DEVICE_CONTEXT

from interlock.engine import Engine, EngineConfig
from interlock.models.loader import LoadedModel, load_model
from interlock.protocol.grammar import JsonSchema, Reasoning
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig
from interlock.testing.families import FAMILIES, THINK, hf_model, save_dir

# One worker runs the whole module (`make test` is --dist loadgroup), so that its module fixtures
# (the checkpoints and models) are built once, not once on each worker.
pytestmark = pytest.mark.xdist_group("engine-families")

PROMPTS = ["Ann is 31 and lives in Oslo. Answer with JSON.", "Bob, aged 40: the record as JSON, please."]
HEAD = ("You extract one record from the text below and answer with JSON only: the person's name and age, "
        "nothing else, no comments. Text: ")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: save_dir(hf_model(name), root / name, thinking=name == "qwen3") for name in FAMILIES}


@pytest.fixture(scope="module")
def loaded(checkpoints) -> dict[str, LoadedModel]:
    return {name: load_model(str(path)) for name, path in checkpoints.items()}


async def outputs(lm: LoadedModel, speculative: SpeculativeConfig | None, prompts: list[str], *, waves: int = 1,
                  cached: list[int] | None = None, **kw) -> list[list[tuple[int, ...]]]:
    """Each wave's greedy JSON outputs; cached: gets the prompt tokens the engine found cached."""
    config = EngineConfig(speculative=speculative, max_batch_size=len(prompts), **kw)
    sampling = SamplingParams(temperature=0.0, max_tokens=32)
    out = []
    async with Engine(lm, config) as engine:
        for _ in range(waves):
            done = await complete_all(engine, [(p, JsonSchema(SCHEMA), sampling) for p in prompts], timeout_s=300)
            for c in done:
                if c.finish_reason == "stop":
                    json.loads(c.text)                         # a finished output is the grammar's
            out.append([c.token_ids for c in done])
        await wait_idle(engine)
        await assert_all_free(engine)
        if cached is not None:
            cached.append((await engine.metrics()).cached_prompt_tokens)
    return out


@pytest.mark.parametrize("name", FAMILIES)
async def test_every_drafter_gives_the_plain_greedy_output(name: str, loaded, checkpoints) -> None:
    lm = loaded[name]
    plain = await outputs(lm, None, PROMPTS)
    assert len({t for out in plain[0] for t in out}) >= 4, plain        # not one token over and over
    modes = ["ngram+forced", "suffix+forced", "self-draft:1+forced", f"draft:{checkpoints[name]}+forced"]
    for mode in modes:
        got = await outputs(lm, SpeculativeConfig.parse(mode, max_draft_len=3), PROMPTS)
        assert got == plain, mode


@pytest.mark.parametrize("name", ["gemma3", "phi3"])
async def test_a_prefix_cache_hit_past_the_window_gives_the_same_output(name: str, loaded) -> None:
    prompts = [HEAD + "Ann is 31.", HEAD + "Bob, aged 40, lives here."]       # a 30-token shared head
    speculative = SpeculativeConfig.parse("ngram+forced", max_draft_len=3)
    plain = await outputs(loaded[name], speculative, prompts, waves=2, prefix_caching=False, block_size=4,
                          prefill_chunk=8)
    hits: list[int] = []
    cached = await outputs(loaded[name], speculative, prompts, waves=2, prefix_caching=True, block_size=4,
                           prefill_chunk=8, cached=hits)
    assert cached == plain and plain[0] == plain[1]
    assert hits[0] > 2 * loaded[name].config.sliding_window      # hits that reach past the window


def test_thinking_markers_come_from_the_tokenizer(loaded) -> None:
    assert loaded["qwen3"].tokenizer.reasoning_markers == THINK
    assert loaded["gemma3"].tokenizer.reasoning_markers is None          # no <think> token: text markers


def test_enable_thinking_follows_the_request(loaded) -> None:
    """Where the chat template has the switch: on for a Reasoning grammar, off for any other grammar
    (the answer must start at once), the template's own default with no grammar."""
    tok = loaded["qwen3"].tokenizer
    messages = [{"role": "user", "content": "hi"}]
    thinking = tok.decode(tok.encode_prompt(messages, grammar=Reasoning(then=JsonSchema(SCHEMA))))
    plain = tok.decode(tok.encode_prompt(messages, grammar=JsonSchema(SCHEMA)))
    free = tok.decode(tok.encode_prompt(messages))
    assert plain.endswith("<think>\n\n</think>\n\n") and not thinking.endswith("</think>\n\n")
    assert free == thinking
    other = loaded["gemma3"].tokenizer                  # no switch in its template: the grammar changes nothing
    assert other.encode_prompt(messages, grammar=JsonSchema(SCHEMA)) == other.encode_prompt(messages)


@pytest.mark.parametrize("name", ["gemma3", "phi4-mini"])
async def test_tensor_parallel_speculative_equals_plain(name: str, checkpoints) -> None:
    """Two gloo ranks, each holding half the heads (Phi-4-mini's fused projections cut by heads, Gemma's
    sliding layers and norms): greedy JSON output with a self-draft equals plain decoding."""
    got = {}
    for mode in ("none", "self-draft:1+forced"):
        engine = Engine.from_pretrained(str(checkpoints[name]), speculative=mode, draft_len=3, tensor_parallel=2,
                                        max_batch_size=2, tp_step_timeout_s=60.0)
        async with engine:
            with anyio.fail_after(300):
                got[mode] = [(await engine.complete(p, grammar=JsonSchema(SCHEMA),
                                                    sampling=SamplingParams(temperature=0.0, max_tokens=24))).token_ids
                             for p in PROMPTS]
    assert got["none"] == got["self-draft:1+forced"] and all(got["none"])


@pytest.mark.parametrize("name", ["gemma3", "phi4-mini", "qwen3"])
async def test_device_runner_speculative_equals_plain(name: str, checkpoints) -> None:
    """The device runner (float32 reference ops and the CPU timeline: the CUDA engine's path) keeps the law."""
    lm = load_model(str(checkpoints[name]), weights="float")
    got = {}
    for mode in ("none", "ngram+forced", "suffix+forced", "self-draft+forced"):
        spec = SpeculativeConfig.parse(mode, max_draft_len=3)
        got[mode] = (await outputs(lm, spec, PROMPTS, runner="device", device="cpu", max_context=DEVICE_CONTEXT))[0]
    assert got["ngram+forced"] == got["none"] == got["suffix+forced"] == got["self-draft+forced"]
