"""Speculation changes speed, never output: greedy constrained output on JME rows is the same
token for token with every speculative mode as without speculation, and always valid.

By default 3 rows of 40 tokens in the three modes that combine every drafter kind (the tiny
preset's tests cover each mode alone at length); the soak runs every mode on 10 rows of 96 tokens
(`pytest -m soak tests/engine/test_exactness.py`)."""
from __future__ import annotations

import jsonschema
import pytest
from bench_data import JSONSCHEMABENCH as DATASETS

from interlock.benchmarks.prompts import build_messages, load_rows
from interlock.engine import Engine, EngineConfig
from interlock.protocol.grammar import GrammarConfig, JsonSchema
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from helpers import complete_all

MODES = ["none", "ngram", "forced", "ngram+forced", "ngram+forced+adaptive", "suffix+forced", "self-draft+forced"]


async def run_rows(loaded, rows, mode: str, backend: str, max_tokens: int) -> list:
    config = EngineConfig(speculative=SpeculativeConfig.parse(mode, max_draft_len=3),
                          grammar=GrammarConfig(backend=backend), max_batch_size=len(rows))
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    async with Engine(loaded, config) as engine:
        results = await complete_all(engine, [(build_messages(r), JsonSchema(r.schema), sampling) for r in rows],
                                     timeout_s=600)
        resources = await engine.resources()
    assert resources["kv_free_blocks"] == resources["kv_total_blocks"] and resources["matchers"] == 0
    return results


SHORT = ["ngram+forced+adaptive", "suffix+forced", "self-draft+forced"]
SIZES = [pytest.param(3, 40, SHORT, id="short"), pytest.param(10, 96, MODES[1:], id="soak", marks=pytest.mark.soak)]


@pytest.mark.parametrize("n_rows,max_tokens,modes", SIZES)
@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
async def test_every_speculative_mode_matches_no_speculation_token_for_token(smollm, backend: str, n_rows: int,
                                                                             max_tokens: int, modes: list) -> None:
    rows = load_rows(DATASETS / "JME.jsonl", limit=n_rows)
    baseline = await run_rows(smollm, rows, "none", backend, max_tokens)
    for completion, row in zip(baseline, rows):
        if completion.finish_reason == "stop":        # complete outputs validate against the schema
            jsonschema.validate(__import__("json").loads(completion.text), row.schema)
    if max_tokens >= 96:
        assert sum(c.finish_reason == "stop" for c in baseline) >= n_rows // 2
    for mode in modes:
        got = await run_rows(smollm, rows, mode, backend, max_tokens)
        for row, want, have in zip(rows, baseline, got):
            assert have.token_ids == want.token_ids, f"{mode} differs on {row.id}"
            assert have.finish_reason == want.finish_reason
        assert sum(c.stats.steps for c in got) < sum(c.stats.steps for c in baseline)   # it did speculate
