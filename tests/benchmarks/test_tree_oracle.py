"""tree_oracle's accounting: what a step's committed tokens say about its draft and siblings, the
projection of trees from step records and row costs, and a run end to end on the tiny model."""
import json

import pytest
from bench_scripts import run_main, usage_error

from interlock.benchmarks import tree_oracle
from interlock.benchmarks.tree_oracle import SiblingRecorder, StepRecord, outcome, project
from interlock.drafters.suffix import SuffixConfig, SuffixDrafter
from interlock.models.loader import load_model
from interlock.protocol.speculative import DraftRequest


def test_outcome_reads_where_the_chain_was_refused_and_whether_a_sibling_had_the_target() -> None:
    # forced 5, lookups 6 7 8 with runners-up; the target refused 7 and wanted 9 (the second runner-up)
    sibs = ((1,), (4, 9), (2,))
    assert outcome((5, 6, 7, 8), 1, sibs, (5, 6, 9)) == StepRecord(1, 4, 2, (1, 2, 1), 1)
    # refused at the first lookup token with a token no sibling had
    assert outcome((5, 6, 7, 8), 1, sibs, (5, 3)) == StepRecord(1, 4, 1, (1, 2, 1), None)
    # everything accepted, then the target's bonus token: nothing refused
    assert outcome((5, 6), 1, ((3,),), (5, 6, 4)) == StepRecord(1, 2, 2, (1,), None)
    # no draft at all: a plain decode step
    assert outcome((), 0, (), (4,)) == StepRecord(0, 0, 0, (), None)
    # the output ended inside the accepted drafts: no answer to read
    assert outcome((5, 6, 7), 0, ((1,), (2,), (3,)), (5, 6)) is None


def test_project_adds_sibling_rows_and_won_tokens_step_by_step() -> None:
    records = [StepRecord(0, 3, 0, (1, 1, 1), 0),        # refused at the first lookup, its sibling won
               StepRecord(0, 3, 1, (1, 0, 1), 0),        # refused at the second, whose sibling won
               StepRecord(1, 3, 3, (1, 1), None)]        # all accepted
    cost = {r: 10.0 + 2.0 * r for r in range(1, 12)}     # ms of a forward of r rows
    first = project(records, cost, 2, "first")
    # chain: 4 rows each (18 ms), tokens 1 + 2 + 4; "first": +1 row on each step, the first step wins
    assert first["extra_rows"] == 3 and first["wins"] == 1
    assert first["chain_tokens_per_s"] == pytest.approx(1e3 * 7 / 54, abs=0.01)
    assert first["tree_tokens_per_s"] == pytest.approx(1e3 * 8 / 60, abs=0.01)
    every = project(records, cost, 2, "all")
    # "all": +3, +2 and +2 rows; both refused steps win
    assert every["extra_rows"] == 7 and every["wins"] == 2
    assert every["tree_over_chain"] == pytest.approx((9 / (24 + 22 + 22)) / (7 / 54), abs=1e-4)
    with pytest.raises(ValueError):
        project(records, cost, 2, "some")


def test_the_recorder_drafts_as_the_suffix_drafter_and_records_each_step() -> None:
    cfg = SuffixConfig(max_depth=8, max_spec_factor=4.0, min_token_prob=0.0)
    recorder = SiblingRecorder(SuffixDrafter(cfg, max_draft_len=4), width=2)
    plain = SuffixDrafter(cfg, max_draft_len=4)
    prompt = (0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 9, 0, 1, 2)
    recorder.add("r", prompt)
    plain.add("r", prompt)
    [draft] = recorder.propose([DraftRequest("r", ())], 3)
    assert draft == plain.lookup("r", 3) == [3, 0, 1]
    recorder.commit("r", (9, 5))                 # the target refused 3 and wanted 9: the runner-up
    assert recorder.records == [StepRecord(0, 3, 0, (1, 0, 0), 0)]     # only (0, 1, 2) branches
    [draft] = recorder.propose([DraftRequest("r", (), forced=(7,))], 3)
    assert draft[0] == 7                         # the forced token first
    recorder.remove("r")
    assert recorder.counts()["suffix_requests"] == 0


def test_runs_end_to_end_and_saves_its_records(tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "tree.json"
    run_main(tree_oracle, ["--limit", "2", "--repeats", "2", "--max-tokens", "12", "--rounds", "1",
                           "--step-repeats", "1", "--out", str(out)], monkeypatch, model=load_model("tiny"))
    saved = json.loads(out.read_text())
    assert saved["steps"] == len(saved["records"]) > 0 and len(saved["outputs"]) == 4
    assert {s["rows_cost"] for s in saved["shapes"]} == {"dense head", "no head"}
    rows_needed = max(r["drafted"] + 1 + sum(r["siblings"]) for r in saved["records"])
    assert sorted(map(int, saved["step_ms"]["no head"])) == list(range(1, rows_needed + 1))
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["saved"] == str(out)


def test_a_tree_needs_a_runner_up(monkeypatch, capsys) -> None:
    assert "--width" in usage_error(tree_oracle, ["--width", "1"], monkeypatch, capsys)
