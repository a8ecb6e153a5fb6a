"""benchmarks/gpu_engine.py's code run on the CPU with the tiny shape (on a GPU, make gpu-check runs it
at real shapes): every configuration produces tokens, steady decode replays captured steps, and the
engine's greedy JSON output equals HF generate() + xgrammar's on the same weights, token for token."""
from __future__ import annotations

import json

from interlock.benchmarks import gpu_engine


def test_the_engine_benchmark_runs_and_agrees_with_its_peer(tmp_path) -> None:
    out = tmp_path / "gpu-engine.json"
    gpu_engine.main(["--device", "cpu", "--shapes", "tiny", "--concurrency", "1", "2", "--max-tokens", "8",
                     "--out", str(out)])
    r = json.loads(out.read_text())["shapes"]["tiny"]
    assert "error" not in r, r.get("error")
    rows = r["engine"]
    assert {(x["mode"], x["grammar"], x["concurrency"]) for x in rows} == \
        {(m, g, c) for m in gpu_engine.MODES for g in (False, True) for c in (1, 2)}
    assert all(x["tokens"] > 0 and x["replayed_steps"] > 0 for x in rows)
    assert r["eager"][0]["replayed_steps"] == 0 and r["bare_forward_ms"] > 0
    ours = next(x for x in rows if x["mode"] == "none" and x["grammar"] and x["concurrency"] == 1)
    peer = r["peer"][0]
    assert peer["batch"] == 1 and ours["token_ids_first"] == peer["token_ids_first"][: len(ours["token_ids_first"])]
