"""benchmarks/model_speed.py and common.py: the timed loop decodes what greedy_generate decodes,
and the summaries compute the rates the report claims (no timing is asserted)."""
from __future__ import annotations

import json
import math

import pytest

from interlock.benchmarks.common import percentile, print_json_last
from interlock.benchmarks.model_speed import Run, agree_prefix, parse_args, run_ours, summarize
from interlock.testing.greedy import greedy_generate


@pytest.mark.parametrize("weights", ["int8", "float"])
def test_timed_loop_decodes_the_greedy_tokens(request, weights: str) -> None:
    tiny = request.getfixturevalue("tiny" if weights == "int8" else "tiny_float")
    prompt = tiny.tokenizer.encode_prompt([{"role": "user", "content": "Name three colours, please."}])
    run = run_ours(tiny.model, prompt, 6)
    assert list(run.tokens) == greedy_generate(tiny.model, prompt, 6)
    assert 0 < run.prefill_s < run.total_s and run.step_decode_s > 0


def test_summarize_uses_medians_then_subtracts_the_prefill() -> None:
    # prefill medians 1.0 s, total medians 3.0 s -> decode 2.0 s for N - 1 = 4 tokens.
    runs = [Run(1.0, 3.0, (1, 2), 2.0), Run(0.5, 9.0, (1, 2), 1.0), Run(7.0, 2.5, (3, 4), 4.0)]
    s = summarize("x", runs, prompt_len=10, n=5)
    assert s.prefill_tok_s == pytest.approx(10.0)
    assert s.decode_tok_s == pytest.approx(2.0)
    assert s.step_decode_tok_s == pytest.approx(2.0)
    assert s.tokens == (3, 4)


def test_summarize_is_nan_not_negative_when_noise_swamps_decode() -> None:
    assert math.isnan(summarize("x", [Run(2.0, 1.5, (), 1.0)], prompt_len=4, n=3).decode_tok_s)


def test_agree_prefix() -> None:
    assert agree_prefix((1, 2, 3), (1, 2, 4)) == 2
    assert agree_prefix((), (1,)) == 0
    assert agree_prefix((5, 6), (5, 6, 7)) == 2


def test_parse_args_rejects_nonsense() -> None:
    assert parse_args(["--tokens", "8", "--repeats", "2", "--threads", "1", "--json-only"]).json_only
    for bad in (["--tokens", "1"], ["--repeats", "0"], ["--threads", "0"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 0) == 1.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([10.0, 20.0], 25) == pytest.approx(12.5)
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_json_last_line_is_valid_json_with_nan_as_null(capsys: pytest.CaptureFixture[str]) -> None:
    print("a table first")
    print_json_last({"ratio": 2.5, "missing": math.nan, "name": "ours"})
    last = capsys.readouterr().out.splitlines()[-1]
    assert json.loads(last) == {"ratio": 2.5, "missing": None, "name": "ours"}


def test_oversubscribed_counts_our_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from interlock.benchmarks import common

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(common, "load_average", lambda: (1.0, 1.0, 1.0))
    assert not common.oversubscribed(1)
    assert common.oversubscribed(2)
    monkeypatch.setattr(common, "load_average", lambda: None)
    assert not common.oversubscribed(64)


def test_step_costs_run_on_the_tiny_model(tiny, tiny_float) -> None:
    from interlock.benchmarks import step_costs

    c = step_costs.measure(tiny.model, context=40, repeats=2)
    assert c.kv_dtype == tiny.config.cache_dtype
    assert step_costs.measure(tiny.model, context=40, repeats=1, kv_dtype="float32").kv_dtype == "float32"
    assert c.context == 40 and c.floor_ms > 0 and c.decode_ms > 0 and c.verify4_ms > 0 and c.prefill_tok_s > 0
    assert c.decode_over_floor == pytest.approx(c.decode_ms / c.floor_ms)
    with pytest.raises(ValueError, match="int8"):
        step_costs.weight_floor_s(tiny_float.model, 1)
