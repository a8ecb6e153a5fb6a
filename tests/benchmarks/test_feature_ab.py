import json

import pytest
from bench_scripts import run_main

from interlock.actors.grammar_actor import GrammarActor
from interlock.benchmarks import feature_ab
from interlock.models.llama import Transformer
from interlock.models.loader import load_model


@pytest.mark.parametrize("feature, mode, repeats", [("head", "ngram+forced", 1), ("draft-check", "ngram+forced", 1),
                                                   ("long-drafts", "suffix+forced", 2)])
def test_alternates_off_and_on_on_the_same_rows(feature, mode, repeats, tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "head.json"
    sparse, check = Transformer.__dict__["sparse_head"], GrammarActor.__dict__["check"]
    run_main(feature_ab, ["--feature", feature, "--limit", "2", "--rounds", "2", "--speculative", mode,
                          "--repeats", str(repeats), "--out", str(out)], monkeypatch, model=load_model("tiny"))
    assert Transformer.__dict__["sparse_head"] is sparse and GrammarActor.__dict__["check"] is check, "put back"
    saved = json.loads(out.read_text())
    (row,) = saved["modes"]
    assert saved["feature"] == feature and row["mode"] == mode and row["same_outputs"] is True
    assert len(row["off_runs"]) == len(row["on_runs"]) == 2
    assert all(len(run["outputs"]) == 2 * repeats for side in saved["runs"][0].values() for run in side)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["saved"] == str(out)
