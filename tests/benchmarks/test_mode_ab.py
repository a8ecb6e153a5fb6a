import json
import sys

import pytest

from interlock.benchmarks import mode_ab
from interlock.models.loader import load_model


def test_alternates_two_modes_on_the_same_rows(tmp_path, monkeypatch, capsys) -> None:
    tiny = load_model("tiny")
    monkeypatch.setattr(mode_ab, "load_model", lambda name: tiny)
    # main() configures logging and torch's threads for a process of its own: not this one's.
    monkeypatch.setattr(mode_ab, "configure_logging", lambda **kw: None)
    monkeypatch.setattr(mode_ab.torch, "set_num_threads", lambda n: None)
    out = tmp_path / "modes.json"
    monkeypatch.setattr(sys, "argv", ["mode_ab", "--modes", "ngram+forced,suffix+forced", "--limit", "2",
                                      "--repeats", "2", "--max-tokens", "16", "--rounds", "2", "--out", str(out)])
    mode_ab.main()
    saved = json.loads(out.read_text())
    assert [row["mode"] for row in saved["modes"]] == ["ngram+forced", "suffix+forced"]
    assert saved["same_outputs"] is True and saved["modes"][0]["ratio"] == 1.0
    for mode, runs in saved["results"].items():
        assert len(runs) == 2 and all(run["mode"] == mode and len(run["outputs"]) == 4 for run in runs)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["saved"] == str(out)


def test_two_different_modes_are_required(monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["mode_ab", "--modes", "ngram+forced"])
    with pytest.raises(SystemExit) as exit_info:
        mode_ab.main()
    assert exit_info.value.code == 2 and "two different modes" in capsys.readouterr().err


def test_a_repeat_schema_row_that_is_not_there_is_a_usage_error_before_loading(monkeypatch, capsys) -> None:
    monkeypatch.setattr(mode_ab, "load_model", lambda name: pytest.fail("loaded a model for a bad row"))
    monkeypatch.setattr(sys, "argv", ["mode_ab", "--modes", "ngram+forced,suffix+forced", "--repeat-schema", "JME_nope"])
    with pytest.raises(SystemExit) as exit_info:
        mode_ab.main()
    assert exit_info.value.code == 2 and "argument --repeat-schema" in capsys.readouterr().err
