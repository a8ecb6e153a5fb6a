"""Speculation changes speed, never output: greedy constrained output on JME rows is the same
token for token with every speculative mode as without speculation, and always valid."""
from __future__ import annotations

import anyio
import jsonschema
import pytest

from interlock.benchmarks.prompts import DATASETS, build_messages, load_rows
from interlock.engine import Engine, EngineConfig
from interlock.protocol.grammar import GrammarConfig, JsonSchema
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

ROWS = 10
MODES = ["none", "ngram", "forced", "ngram+forced", "ngram+forced+adaptive", "suffix+forced", "self-draft+forced"]


async def run_rows(loaded, rows, mode: str, backend: str) -> list:
    config = EngineConfig(speculative=SpeculativeConfig.parse(mode, max_draft_len=3),
                          grammar=GrammarConfig(backend=backend), max_batch_size=ROWS)
    sampling = SamplingParams(temperature=0.0, max_tokens=96)
    async with Engine(loaded, config) as engine:
        results = [None] * len(rows)

        async def one(i: int) -> None:
            results[i] = await engine.complete(build_messages(rows[i]), grammar=JsonSchema(rows[i].schema),
                                               sampling=sampling)

        with anyio.fail_after(600):
            async with anyio.create_task_group() as tg:
                for i in range(len(rows)):
                    tg.start_soon(one, i)
        resources = await engine.resources()
    assert resources["kv_free_blocks"] == resources["kv_total_blocks"] and resources["matchers"] == 0
    return results


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
async def test_every_speculative_mode_matches_no_speculation_token_for_token(smollm, backend: str) -> None:
    rows = load_rows(DATASETS / "JME.jsonl", limit=ROWS)
    baseline = await run_rows(smollm, rows, "none", backend)
    for completion, row in zip(baseline, rows):
        if completion.finish_reason == "stop":        # complete outputs validate against the schema
            jsonschema.validate(__import__("json").loads(completion.text), row.schema)
    assert sum(c.finish_reason == "stop" for c in baseline) >= ROWS // 2
    for mode in MODES[1:]:
        got = await run_rows(smollm, rows, mode, backend)
        for row, want, have in zip(rows, baseline, got):
            assert have.token_ids == want.token_ids, f"{mode} differs on {row.id}"
            assert have.finish_reason == want.finish_reason
        assert sum(c.stats.steps for c in got) < sum(c.stats.steps for c in baseline)   # it did speculate
