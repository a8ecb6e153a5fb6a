import json

import pytest
from bench_scripts import run_main, usage_error

from interlock.benchmarks import mode_ab
from interlock.models.loader import load_model


def test_alternates_two_modes_on_the_same_rows(tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "modes.json"
    run_main(mode_ab, ["--modes", "ngram+forced,suffix+forced", "--limit", "2", "--repeats", "2", "--max-tokens", "16",
                       "--rounds", "2", "--out", str(out)], monkeypatch, model=load_model("tiny"))
    saved = json.loads(out.read_text())
    assert [row["mode"] for row in saved["modes"]] == ["ngram+forced", "suffix+forced"]
    assert saved["same_outputs"] is True and saved["modes"][0]["ratio"] == 1.0
    for mode, runs in saved["results"].items():
        assert len(runs) == 2 and all(run["mode"] == mode and len(run["outputs"]) == 4 for run in runs)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["saved"] == str(out)


def test_two_different_modes_are_required(monkeypatch, capsys) -> None:
    assert "two different modes" in usage_error(mode_ab, ["--modes", "ngram+forced"], monkeypatch, capsys)


def test_a_repeat_schema_row_that_is_not_there_is_a_usage_error_before_loading(monkeypatch, capsys) -> None:
    monkeypatch.setattr(mode_ab, "load_model", lambda name: pytest.fail("loaded a model for a bad row"))
    err = usage_error(mode_ab, ["--modes", "ngram+forced,suffix+forced", "--repeat-schema", "JME_nope"], monkeypatch, capsys)
    assert "argument --repeat-schema" in err
