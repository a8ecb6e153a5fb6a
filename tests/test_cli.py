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
    ["serve", "--speculative", "self-draft:x"],
    ["generate", "--draft-len", "0", "hi"],
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
    assert args.speculative == "none,ngram:4+forced"


@pytest.mark.parametrize(("flag", "kv_dtype"), [([], None), (["--kv-cache-dtype", "auto"], None),
                                                (["--kv-cache-dtype", "float32"], "float32")])
def test_kv_cache_dtype_reaches_the_loader_as_kv_dtype(flag: list[str], kv_dtype: str | None) -> None:
    from interlock.cli import _kv_dtype

    assert _kv_dtype(build_parser().parse_args([*flag, "generate", "hi"])) == kv_dtype
