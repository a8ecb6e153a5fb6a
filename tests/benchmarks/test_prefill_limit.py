"""benchmarks/prefill_limit.py: the op groups, the GEMM work it divides by, and a whole run on the
tiny preset (shares of the forward that add up, a peak it measured)."""
from __future__ import annotations

import json
import sys

import pytest

from interlock.benchmarks import prefill_limit
from interlock.models.loader import load_model


def test_ops_fall_in_their_groups() -> None:
    assert prefill_limit.group_of("aten::linear") == "gemm"
    assert prefill_limit.group_of("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert prefill_limit.group_of("interlock_cpu::int8_linear") == "head"
    assert prefill_limit.group_of("interlock_cpu::rms_norm") == "norms_rope"
    assert prefill_limit.group_of("aten::to") == "conversions"
    assert prefill_limit.group_of("aten::index_select") == "other"


def test_gemm_ops_count_every_projection_of_every_layer(tiny) -> None:
    lm = tiny
    c = lm.config
    by_hand = sum(2 * 8 * k * n for k, n in [(c.hidden_size, c.n_heads * c.head_dim),            # q
                                             (c.hidden_size, 2 * c.n_kv_heads * c.head_dim),     # k, v
                                             (c.n_heads * c.head_dim, c.hidden_size),            # o
                                             (c.hidden_size, 2 * c.intermediate_size),           # gate, up
                                             (c.intermediate_size, c.hidden_size)]) * c.n_layers  # down
    assert prefill_limit.gemm_ops(lm, 8) == by_hand


def run(monkeypatch: pytest.MonkeyPatch, lm, out, path: str) -> dict:
    monkeypatch.setattr(prefill_limit, "load_model", lambda name: lm)
    monkeypatch.setattr(prefill_limit.torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(prefill_limit, "gemm_peaks", lambda m, k, n, r: {"fp32": 10.0 + m / 1000})
    monkeypatch.setattr(sys, "argv", ["prefill_limit", "--contexts", "0,24", "--chunk", "40", "--repeats", "2",
                                      "--path", path, "--out", str(out)])
    prefill_limit.main()
    return json.loads(out.read_text())


def test_a_dense_run_reports_shares_that_add_up_and_a_gemm_rate(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                                                 capsys) -> None:
    out = tmp_path / "limit.json"
    result = run(monkeypatch, load_model("tiny"), out, "dense")     # its own: the run sets rows_prefill
    assert result["peak_gops"] == 10.512 and [r["context"] for r in result["rows"]] == [0, 24]
    assert result["rows_prefill"] is False
    for row in result["rows"]:
        shares = [v for k, v in row.items() if k.startswith("share_")]
        assert abs(sum(shares) - 1) < 0.01 and row["share_gemm"] > 0 and row["gemm_gops"] > 0
        assert "share_layers_native" not in row
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["saved"] == str(out)


def test_a_rows_run_groups_the_native_layers_and_reports_no_gemm_rate(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path) -> None:
    lm = load_model("tiny")                                         # its own: the run sets rows_prefill
    if lm.model.fused_rows is None:
        pytest.skip("the native kernels did not build: no rows path")
    result = run(monkeypatch, lm, tmp_path / "limit.json", "rows")
    assert result["rows_prefill"] is True
    for row in result["rows"]:
        shares = [v for k, v in row.items() if k.startswith("share_")]
        assert abs(sum(shares) - 1) < 0.01 and row["share_layers_native"] > 0     # the fused layers ran and were timed
        assert "share_gemm" not in row and row["gemm_gops"] is None and row["gemm_of_peak"] is None
