"""The CLI's argument checks: bad values are usage errors (exit 2, the flag named), not tracebacks."""
from __future__ import annotations

import pytest

from interlock.cli import build_parser

DATASET = __file__          # --dataset must name a file that exists


@pytest.mark.parametrize("argv", [
    ["generate", "--speculative", "eagle", "hi"],
    ["generate", "--speculative", "ngram:0+forced", "hi"],
    ["bench", "--dataset", DATASET, "--speculative", "none,ngram:x"],
    ["bench", "--dataset", "/nonexistent/x.jsonl"],
    ["bench", "--dataset", DATASET, "--repeats", "0"],
    ["bench", "--dataset", DATASET, "--rounds", "0"],
    ["serve", "--speculative", "self-draft:x"],
    ["generate", "--draft-len", "0", "hi"],
    ["generate", "--draft-len", "17", "hi"],
    ["serve", "--draft-len", "17"],
    ["--kv-cache-dtype", "fp8", "generate", "hi"],
    ["generate", "hi", "--schema", "/nonexistent/schema.json"],
    ["generate", "hi", "--grammar", "/nonexistent/g.lark"],
])
def test_bad_values_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    flag = [a for a in argv if a.startswith("--")][-1]          # each case's bad value is its last flag
    assert f"argument {flag}" in capsys.readouterr().err


def test_good_values_pass_through_unchanged() -> None:
    args = build_parser().parse_args(["bench", "--dataset", DATASET, "--speculative", "none,ngram:4+forced"])
    assert args.speculative == "none,ngram:4+forced" and args.rounds == 1


@pytest.mark.parametrize(("flag", "kv_dtype"), [([], None), (["--kv-cache-dtype", "auto"], None),
                                                (["--kv-cache-dtype", "float32"], "float32")])
def test_kv_cache_dtype_reaches_the_loader_as_kv_dtype(flag: list[str], kv_dtype: str | None) -> None:
    from interlock.cli import _kv_dtype

    assert _kv_dtype(build_parser().parse_args([*flag, "generate", "hi"])) == kv_dtype


def test_a_repeat_schema_row_that_is_not_there_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from bench_data import JSONSCHEMABENCH as DATASETS

    from interlock.cli import main

    with pytest.raises(SystemExit) as exit_info:        # before any model loads
        main(["bench", "--dataset", str(DATASETS / "JME.jsonl"), "--repeat-schema", "JME_nope"])
    assert exit_info.value.code == 2
    assert "argument --repeat-schema" in capsys.readouterr().err


def test_repeat_schema_benches_one_schema_with_varied_documents() -> None:
    from pathlib import Path

    from bench_data import JSONSCHEMABENCH as DATASETS

    from interlock.benchmarks.engine_bench import BenchConfig, bench_rows
    from interlock.benchmarks.workloads import REPEATED_ROW

    rows = bench_rows(BenchConfig(dataset=Path(DATASETS / "JME.jsonl"), limit=5, repeat_schema=REPEATED_ROW))
    assert len(rows) == 5 and len({repr(r.valid_instances[0].data) for r in rows}) == 5
    assert all(r.schema == rows[0].schema for r in rows)
    plain = bench_rows(BenchConfig(dataset=Path(DATASETS / "JME.jsonl"), limit=5))
    assert len({repr(r.schema) for r in plain}) > 1
