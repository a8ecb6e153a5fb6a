import json

import pytest
from bench_data import JSONSCHEMABENCH
from bench_scripts import run_main, usage_error

from interlock.benchmarks import ab

JME = str(JSONSCHEMABENCH / "JME.jsonl")


def test_alternates_the_sides_on_the_same_rows(tiny, tmp_path, monkeypatch, capsys) -> None:
    loaded: list[str | None] = []
    monkeypatch.setattr(ab, "load_model", lambda name, kv_dtype=None: loaded.append(kv_dtype) or tiny)
    out = tmp_path / "ab.json"
    sides = ["--speculative ngram+forced", "--speculative suffix+forced --max-long-draft 0",
             "--speculative suffix+forced --prefix-caching off"]
    run_main(ab, [*[a for s in sides for a in ("--side", s)], "--dataset", JME, "--limit", "2", "--repeats", "2",
                  "--max-tokens", "16", "--rounds", "2", "--out", str(out)], monkeypatch)
    assert loaded == [None], "one model for sides that share the KV dtype"
    saved = json.loads(out.read_text())
    assert [row["side"] for row in saved["sides"]] == sides
    assert saved["same_outputs"] is True and saved["sides"][0]["ratio"] == 1.0     # greedy, exact speculation
    for side, runs in saved["results"].items():
        assert len(runs) == 2 and all(len(run["outputs"]) == 4 for run in runs)
    assert [run["mode"] for run in saved["results"][sides[2]]] == ["suffix+forced (no prefix cache)"] * 2
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["saved"] == str(out)


def test_a_side_is_the_workload_with_its_flags_applied() -> None:
    from pathlib import Path

    from interlock.benchmarks.engine_bench import BenchConfig

    base = BenchConfig(dataset=Path(JME), speculative="ngram+forced")
    cfg, kv = ab.parse_side("--prefill dense --kv-cache-dtype float32 --draft-len 5", base)
    assert (cfg.prefill, cfg.draft_len, cfg.speculative, cfg.prefix_caching, kv) == ("dense", 5, "ngram+forced",
                                                                                      True, "float32")
    assert ab.parse_side("--max-long-draft 0", base)[0].suffix.max_long_draft == 0
    assert ab.parse_side("", base) == (base, "auto")


@pytest.mark.parametrize("argv, message", [
    (["--side", "--prefill dense"], "two or more different"),
    (["--side", "--prefill dense", "--side", "--prefill dense"], "two or more different"),
    (["--side", "--prefill dense", "--side", "--prefill sideways"], "invalid choice"),
    (["--side", "--prefill dense", "--side", "--speculative bogus"], "bogus"),
    (["--side", "--prefill dense", "--side", "--nope 1"], "not a side's flag"),
    (["--side", "--prefill dense", "--side", "--prefill rows", "--repeat-schema", "JME_nope"], "--repeat-schema"),
])
def test_bad_sides_are_usage_errors_before_loading(argv, message, monkeypatch, capsys) -> None:
    monkeypatch.setattr(ab, "load_model", lambda *a, **k: pytest.fail("loaded a model for bad arguments"))
    assert message in usage_error(ab, [*argv, "--dataset", JME], monkeypatch, capsys)
