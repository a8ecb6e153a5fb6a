"""mask_bench end to end on its --quick path, over two tiny JSONSchemaBench-format files (a user's
clone has no shared data), and its usage error when the files are missing."""
import json

from bench_scripts import run_main, usage_error

from interlock.benchmarks import mask_bench

ROWS = [{"id": "a", "schema": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                               "required": ["name", "age"]},
         "tests": [{"description": "", "valid": True, "data": {"name": "Ada Lovelace", "age": 36}}]},
        {"id": "b", "schema": {"type": "array", "items": {"type": "number"}},
         "tests": [{"description": "", "valid": True, "data": [1.5, 2, 3.25, 4, 5]}]}]


def test_quick_run_times_both_paths_and_finds_them_identical(tmp_path, monkeypatch, capsys):
    for name in mask_bench.DATASET_FILES:
        (tmp_path / name).write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    out = tmp_path / "result.json"
    run_main(mask_bench, ["--quick", "--data", str(tmp_path), "--out", str(out)], monkeypatch)
    saved = json.loads(out.read_text())
    records = saved["records"]
    assert {(r["backend"], r["batch"]) for r in records} == {(b, n) for b in ("xgrammar", "llguidance") for n in (1, 4)}
    for r in records:
        assert r["identical"] and r["schemas"] == 4
        assert set(r["median_ms"]) == {"per-row", "batched-1", "batched-2"}
        assert all(len(run["seconds"]) == saved["steps"] for run in r["runs"].values())
    assert records[-1]["scripts"]                       # the token ids the requests replayed
    assert "per-row ms" in capsys.readouterr().out


def test_missing_data_is_a_usage_error(tmp_path, monkeypatch, capsys):
    err = usage_error(mask_bench, ["--quick", "--data", str(tmp_path)], monkeypatch, capsys)
    assert "INTERLOCK_DATA" in err and "JME.jsonl" in err
