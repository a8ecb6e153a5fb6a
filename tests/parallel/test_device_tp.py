"""Tensor parallelism on the device runner (parallel/device_group.py): rank 0 in this process, rank 1
a `python -m interlock.parallel.device_worker` process, gloo between them, on the CUDA-rules timeline.

- The sharded forward equals the whole one within fp32 round-off, for every family (q/k norms,
  Gemma 3's post-norms and windows, Phi's partial rotary), prompt and decode rows alike.
- Through the engine: greedy output under TP=2 is the same token for token with n-gram,
  self-draft (its layers sharded too) and draft-model (whole, on rank 0) speculation as without, constrained outputs are valid, captured steps replay (each
  replay announces its forwards to the worker), a prefix-cache hit gives the same output (Gemma
  3's window included), and nothing is left behind.
- A worker killed mid-generation fails the requests in flight with WorkerError and leaves no process.
"""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import anyio
import pytest
import torch

from interlock.engine import Engine
from interlock.engine.load import load_device_shard
from interlock.models.device_llama import DeviceLlama, step_inputs
from interlock.models.batch import SeqChunk
from interlock.models.kv_cache import PagedKVCache
from interlock.models.loader import load_model
from interlock.protocol.errors import EngineError, WorkerError
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import SamplingParams
from interlock.testing.families import FAMILIES, hf_model, save_dir

from resources import DEVICE_CONTEXT

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
PROMPTS = ["Ann is 31 and lives in Oslo. Answer with JSON.", "Bob, aged 40: the record as JSON, please."]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: save_dir(hf_model(name), root / name) for name in FAMILIES}


def forward_twice(model: DeviceLlama, tokens: list[int]) -> torch.Tensor:
    """A prompt chunk, then one decode row reading its K/V: the logits of both."""
    kv = PagedKVCache(model.config, num_blocks=8, block_size=4, spare_blocks=1)
    kv.add_sequence(0)
    out = []
    for start, chunk in ((0, tokens[:-1]), (len(tokens) - 1, tokens[-1:])):
        kv.reserve(0, len(chunk))
        inputs = step_inputs([SeqChunk(0, tuple(chunk), start, ())], kv, max_blocks=8, pad_slot=8 * 4, device="cpu")
        out.append(model(inputs, kv))
    return torch.cat(out)


@pytest.mark.parametrize("name", FAMILIES)
def test_the_sharded_forward_equals_the_whole(name: str, checkpoints) -> None:
    path = str(checkpoints[name])
    whole = DeviceLlama.from_transformer(load_model(path, weights="float").model, "cpu", torch.float32)
    tokens = list(range(40, 61))                    # 21 tokens: past Gemma 3's and Phi-3's windows
    want = forward_twice(whole, tokens)
    shard = load_device_shard(path, 2)
    group = shard.model.tp.leader
    group.start()
    try:
        got = forward_twice(shard.model, tokens)
    finally:
        group.close()
    assert group.forwards == 2 and got.shape == want.shape
    assert not torch.equal(got, torch.zeros_like(got))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


async def run(path: str, mode: str) -> tuple[list, dict, int]:
    engine = Engine.from_pretrained(path, runner="device", tensor_parallel=2, speculative=mode, draft_len=3,
                                    max_batch_size=2, tp_step_timeout_s=30.0, max_context=DEVICE_CONTEXT)
    greedy = SamplingParams(temperature=0.0, max_tokens=32)
    async with engine:
        group = engine.model.model.tp.leader
        pids = group.pids
        out: dict[int, object] = {}

        async def one(i: int) -> None:
            out[i] = await engine.complete(PROMPTS[i], grammar=JsonSchema(SCHEMA), sampling=greedy)

        with anyio.fail_after(300):
            async with anyio.create_task_group() as tg:
                for i in range(len(PROMPTS)):
                    tg.start_soon(one, i)
        again = await engine.complete(PROMPTS[0], grammar=JsonSchema(SCHEMA), sampling=greedy)
        assert again.token_ids == out[0].token_ids                                 # type: ignore[attr-defined]
        assert (await engine.metrics()).cached_prompt_tokens > 0       # a prefix-cache hit, on every rank's K/V
        counts = dict(engine._rt.program.counts)
        res = await engine.resources()
        assert res["kv_free_blocks"] == res["kv_total_blocks"] and res["matchers"] == 0
    assert all(gone(pid) for pid in pids)
    return [out[i] for i in range(len(PROMPTS))], counts, group.forwards


async def test_speculative_equals_plain_under_tp_on_the_device_runner(checkpoints) -> None:
    path = str(checkpoints["gemma3"])
    plain, counts, forwards = await run(path, "none")
    assert len({t for c in plain for t in c.token_ids}) >= 4, plain        # not one token over and over
    assert counts["replayed"] > 0 and forwards >= counts["steps"]
    for c in plain:
        if c.finish_reason == "stop":
            json.loads(c.text)
    for mode in ("ngram+forced", "self-draft:1+forced", f"draft:{path}+forced"):     # the last: whole, on rank 0
        got, counts, _ = await run(path, mode)
        assert [c.token_ids for c in got] == [c.token_ids for c in plain], mode
        assert counts["replayed"] > 0, mode


async def test_a_killed_worker_fails_the_requests_in_flight_and_leaves_no_process(checkpoints) -> None:
    # max_context: its streams ask for 400 tokens, more than DEVICE_CONTEXT holds
    engine = Engine.from_pretrained(str(checkpoints["qwen3"]), runner="device", tensor_parallel=2,
                                    speculative="ngram+forced", tp_step_timeout_s=10.0, max_context=512)
    errors: list[BaseException] = []
    async with engine:
        pids = engine.model.model.tp.leader.pids
        started = anyio.Event()

        async def one(i: int) -> None:
            try:
                async for _ in engine.generate(PROMPTS[i % 2], sampling=SamplingParams(max_tokens=400)):
                    started.set()
            except EngineError as exc:
                errors.append(exc)

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(one, i)
                await started.wait()
                os.kill(pids[0], signal.SIGKILL)
        with pytest.raises(EngineError):
            await engine.complete("after", sampling=SamplingParams(max_tokens=4))
    assert len(errors) == 3 and all(isinstance(e, WorkerError) for e in errors), errors
    assert all(gone(pid) for pid in pids)
