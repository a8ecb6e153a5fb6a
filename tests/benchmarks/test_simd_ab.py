"""benchmarks/simd_ab.py: a whole run on the tiny preset, each side in a child process with its own build."""
from __future__ import annotations

import json

import pytest

from interlock.benchmarks import simd_ab
from interlock.kernels import native


@pytest.mark.skipif(not native.available(), reason="no C++ compiler: native kernels not built")
def test_a_run_times_both_builds_side_by_side(tmp_path, capsys) -> None:
    out = tmp_path / "ab.json"
    simd_ab.main(["--model", "tiny", "--contexts", "0,40", "--rounds", "2", "--repeats", "1", "--threads", "1",
                  "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["kernels"]["portable"] == "portable"
    assert saved["kernels"]["simd"] == native.int8_kernel()          # the child's build is this process's
    assert [list(rd) for rd in saved["rounds"]] == [["simd", "portable"], ["portable", "simd"]]   # alternated
    for key in ("ctx0_decode_ms", "ctx0_verify4_ms", "ctx40_decode_ms", "ctx40_verify4_ms"):
        figures = saved["summary"][key]
        assert figures["simd"] > 0 and figures["portable"] > 0
        assert figures["speedup"] == pytest.approx(figures["portable"] / figures["simd"], rel=0.02)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["file"] == str(out)
