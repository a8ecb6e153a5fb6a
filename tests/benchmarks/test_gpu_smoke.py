"""gpu-check's smoke and preflight, run on the CPU (on a GPU, make gpu-check runs them on CUDA): the
smoke's captured and eager runs agree and its host-function trace shows the step's two host
functions on the one host thread; the preflight reports each check, with the traceback of any
that fails (here: CUDA and Triton)."""
from __future__ import annotations

import json

import pytest
import torch

from interlock.benchmarks import gpu_preflight, gpu_smoke


def test_the_smoke_runs_every_part_and_traces_the_host_functions(tmp_path) -> None:
    with pytest.raises(SystemExit) as exit_:
        gpu_smoke.main(["--out", str(tmp_path), "--device", "cpu"])
    assert exit_.value.code == 0
    parts = json.loads((tmp_path / "smoke.json").read_text())["parts"]
    runs = ("greedy_json", "seeded_top_k_top_p", "features_self_draft_cfg_penalties_logprobs")
    assert set(parts) == {*runs, "host_trace"}
    assert all(p["ok"] for p in parts.values()), parts
    for name in runs:
        assert parts[name]["metrics_captured"]["replayed_steps"] > 0
        assert parts[name]["metrics_eager"]["replayed_steps"] == 0
    trace = parts["host_trace"]
    assert trace["threads"] == ["interlock-host-functions"] and trace["per_step"] == 2.0
    assert set(trace["by_name"]) == {"GrammarActor.fill", "StepProgram._tail"}
    rows = json.loads((tmp_path / "host-trace.json").read_text())
    assert len(rows) == trace["host_functions"] and all(r["end"] >= r["start"] for r in rows)


def test_the_preflight_reports_each_check_and_the_traceback_of_a_failure(tmp_path, capsys) -> None:
    out = tmp_path / "preflight.txt"
    with pytest.raises(SystemExit) as exit_:
        gpu_preflight.main(["--out", str(out)])
    report = out.read_text()
    assert "== versions: ok" in report and "== imports: ok" in report and "== tokenizer: ok" in report
    if torch.cuda.is_available():
        assert exit_.value.code == 0 and "FAILED" not in report
    else:
        assert exit_.value.code == 1
        assert "== cuda: FAILED" in report and "Traceback (most recent call last)" in report
