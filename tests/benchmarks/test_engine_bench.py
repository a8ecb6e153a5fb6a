"""`interlock bench` reports finish reasons and invalid_stop (outputs that ended with stop yet fail
their schema: the engine's end-of-request check keeps it at 0), in its JSON and its table."""
from __future__ import annotations

import json


from interlock.benchmarks.engine_bench import BenchConfig, report, run_bench

ROWS = [
    {"id": "small", "schema": {"type": "object", "properties": {"a": {"enum": [1, 22]}, "b": {"type": "boolean"}},
                               "required": ["a", "b"]}, "tests": [{"valid": True, "data": {"a": 1, "b": True}}]},
    {"id": "loose", "schema": {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]},
     "tests": []},
    {"id": "bad", "schema": {"type": "object", "properties": {"x": {"type": "no-such-type"}}}, "tests": []},
]


async def test_bench_counts_finish_reasons_and_invalid_stop(tiny, tmp_path, capsys) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    result = await run_bench(tiny, BenchConfig(dataset=data, max_tokens=24, concurrency=2), progress=False)
    reasons = result["finish_reasons"]
    assert set(reasons) == {"stop", "length", "error"}
    assert sum(reasons.values()) == result["requests"] == 3
    assert reasons["error"] >= 1                      # the schema with a type no backend knows
    assert reasons["stop"] >= 1                       # the bounded one completes
    assert result["invalid_stop"] == 0
    assert [o["id"] for o in result["outputs"]] == ["bad", "loose", "small"]
    assert sum(len(o["token_ids"]) for o in result["outputs"]) == result["output_tokens"]
    # the completed requests' times to first token, each inside the run's wall
    assert 0 < result["ttft_total_s"] <= (result["requests"] - reasons["error"]) * result["wall_s"]
    report([{**result, "ratio": 1.0}])
    out = capsys.readouterr().out
    assert "invalid_stop" in out and "stop/length/error" in out
    assert f"{reasons['stop']}/{reasons['length']}/{reasons['error']}" in out
    assert "{" not in out                   # no JSON unasked (the CLI's --json / --out write it)


async def test_rounds_alternate_the_modes_and_report_each_modes_median_run(tiny, tmp_path, monkeypatch, capsys) -> None:
    from interlock.benchmarks import engine_bench

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(ROWS[0]) + "\n")
    order, speeds = [], iter([30.0, 10.0, 20.0, 40.0, 50.0, 60.0])   # none, ngram, ngram, none, none, ngram
    real = engine_bench.run_bench

    async def timed(loaded, cfg, progress=True):
        result = await real(loaded, cfg, progress)
        order.append(cfg.speculative)
        return {**result, "tokens_per_s": next(speeds)}

    monkeypatch.setattr(engine_bench, "run_bench", timed)
    results = await engine_bench.run_modes(tiny, BenchConfig(dataset=data, max_tokens=8), ["none", "ngram+forced"],
                                           progress=False, rounds=3)
    assert order == ["none", "ngram+forced", "ngram+forced", "none", "none", "ngram+forced"]
    none, ngram = results
    assert none["runs_tokens_per_s"] == [30.0, 40.0, 50.0] and none["tokens_per_s"] == 40.0
    assert ngram["runs_tokens_per_s"] == [10.0, 20.0, 60.0] and ngram["tokens_per_s"] == 20.0
    assert none["ratio"] == 1.0 and ngram["ratio"] == 0.5
    report(results)
    assert "median of 3 alternating runs" in capsys.readouterr().out
