"""make gpu-check's driver, run where there is no GPU: every part runs (or fails) within its own limit,
each writes its log under --out, and the summary says which failed (on a CPU the GPU benchmarks do)."""
from __future__ import annotations

from interlock.benchmarks import gpu_check


def test_each_part_is_run_and_reported(tmp_path, monkeypatch) -> None:
    calls = []

    def fake_run(name, argv, out, limit_s, log=None):
        calls.append((name, limit_s))
        (out / f"{name}.log").write_text("ok")
        return name, 1 if name == "gpu-bench" else 0, 1.0

    monkeypatch.setattr(gpu_check, "run", fake_run)
    monkeypatch.setattr(gpu_check, "env_report", lambda out: (out / "env.txt").write_text("cpu"))
    try:
        gpu_check.main(["--out", str(tmp_path)])
    except SystemExit as exit_:
        assert exit_.code == 1                        # a failed part fails the check
    assert [name for name, _ in calls] == ["gpu-tests", "gpu-bench", "gpu-engine", "mask-bench"]
    assert sum(limit for _, limit in calls) <= 8 * 60 - 30    # room for the install and the report
    assert "gpu-bench: exit 1" in (tmp_path / "summary.txt").read_text()


def test_every_cuda_test_file_is_in_the_list() -> None:
    from pathlib import Path

    root = Path(gpu_check.ROOT)
    marker = "skipif(not torch.cuda" + ".is_available()"           # split: this file is no CUDA test
    cuda_files = {str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py") if marker in p.read_text()}
    assert cuda_files and cuda_files <= set(gpu_check.CUDA_TESTS), cuda_files - set(gpu_check.CUDA_TESTS)
