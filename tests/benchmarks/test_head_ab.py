import json
import sys

from interlock.benchmarks import head_ab
from interlock.models.llama import Transformer
from interlock.models.loader import load_model


def test_alternates_dense_and_sparse_heads_on_the_same_rows(tmp_path, monkeypatch, capsys) -> None:
    tiny = load_model("tiny")
    monkeypatch.setattr(head_ab, "load_model", lambda name: tiny)
    # main() configures logging and torch's threads for a process of its own: not this one's.
    monkeypatch.setattr(head_ab, "configure_logging", lambda **kw: None)
    monkeypatch.setattr(head_ab.torch, "set_num_threads", lambda n: None)
    out = tmp_path / "head.json"
    monkeypatch.setattr(sys, "argv", ["head_ab", "--limit", "2", "--rounds", "2", "--speculative", "none",
                                      "--out", str(out)])
    sparse = Transformer.sparse_head
    head_ab.main()
    assert Transformer.sparse_head is sparse, "the switch is put back"
    saved = json.loads(out.read_text())
    (row,) = saved["modes"]
    assert row["mode"] == "none" and row["same_outputs"] is True
    assert len(row["dense_runs"]) == len(row["sparse_runs"]) == 2
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["saved"] == str(out)
