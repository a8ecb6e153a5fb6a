"""make gpu-check's driver, run where there is no GPU, on stand-in parts: every part runs within its
limit and the budget, a hang is killed, what no longer fits is skipped, and summary.txt names every
failed test from the junit XML."""
from __future__ import annotations

import sys
from pathlib import Path

from interlock.benchmarks import gpu_check
from interlock.benchmarks.gpu_check import Part

JUNIT = """<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="2" failures="1" errors="0" skipped="0">
<testcase classname="tests.x" name="test_ok"/>
<testcase classname="tests.x" name="test_bad"><failure message="assert 1 == 2&#10;more">trace</failure></testcase>
</testsuite></testsuites>"""


def test_parts_run_within_limits_and_the_summary_names_failed_tests(tmp_path, monkeypatch) -> None:
    py = sys.executable

    def fake_tests(out: Path) -> list[Part]:
        (out / "junit").mkdir(exist_ok=True)
        (out / "tests").mkdir(exist_ok=True)
        write = f"open({str(out / 'junit' / 'test_x.xml')!r}, 'w').write({JUNIT!r}); raise SystemExit(1)"
        return [Part("test_x", [py, "-c", write], 30, "tests/test_x.log"),
                Part("test_hangs", [py, "-c", "import time; time.sleep(60)"], 6, "tests/test_hangs.log")]

    def fake_others(out: Path, today: str) -> tuple[Part, list[Part]]:
        return (Part("preflight", [py, "-c", "print('ok')"], 30, "preflight.log"),
                [Part("smoke", [py, "-c", "print('smoke')"], 30, "smoke.log"),
                 Part("gpu-bench", [py, "-c", "print(1)"], 3600, "gpu-bench.log")])

    monkeypatch.setattr(gpu_check, "test_parts", fake_tests)
    monkeypatch.setattr(gpu_check, "other_parts", fake_others)
    try:
        gpu_check.main(["--out", str(tmp_path), "--budget-s", "20"])
    except SystemExit as exit_:
        assert exit_.code == 1                       # a failed part fails the check
    summary = (tmp_path / "summary.txt").read_text()
    assert "preflight: exit 0" in summary and "smoke: exit 0" in summary
    assert "test_x: exit 1" in summary
    assert "test_hangs: exit 124 (killed at its limit)" in summary
    assert "tests: 2 tests, 1 failures, 0 errors, 0 skipped" in summary
    assert "FAILED tests.x::test_bad: assert 1 == 2" in summary
    assert "no junit XML" in summary and "test_hangs" in summary.split("no junit XML")[1]
    assert (tmp_path / "smoke.log").read_text().strip() == "smoke"


def test_a_part_that_no_longer_fits_the_budget_is_skipped(tmp_path) -> None:
    parts = [Part("late", [sys.executable, "-c", "print(1)"], 30, "late.log")]
    gpu_check.run(parts, tmp_path, deadline=0.0)
    assert parts[0].code is None
    assert "late: skipped (out of budget)" in gpu_check.summarize(tmp_path, parts)


def test_every_cuda_test_file_is_in_the_list_and_the_budget_fits_8_minutes() -> None:
    root = Path(gpu_check.ROOT)
    marker = "skipif(not torch.cuda" + ".is_available()"           # split: this file is no CUDA test
    cuda_files = {str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py") if marker in p.read_text()}
    listed = {path for path, _ in gpu_check.CUDA_TESTS}
    assert cuda_files and cuda_files <= listed, cuda_files - listed
    assert gpu_check.BUDGET_S <= 8 * 60 - 10


def test_engine_files_run_their_cuda_cases_with_a_step_timeout_under_every_limit(tmp_path) -> None:
    """Their CPU cases (CI's) on the CUDA-rules timeline would eat the part's limit before the CUDA
    cases ran; a hung step must end as a typed error in the junit XML, not as a kill."""
    parts = {p.name: p for p in gpu_check.test_parts(tmp_path)}
    for path, limit in gpu_check.CUDA_TESTS:
        argv = parts[Path(path).stem].argv
        assert (["-k", "cuda"] == argv[argv.index("-k"): argv.index("-k") + 2]) if path.startswith("tests/engine/") \
            else "-k" not in argv, argv
        assert gpu_check.STEP_TIMEOUT_S < limit - 15       # and under faulthandler's dump
    assert gpu_check._env()["INTERLOCK_TEST_STEP_TIMEOUT_S"] == str(gpu_check.STEP_TIMEOUT_S)


def test_preflight_names_what_is_too_old_for_the_carried_wheels() -> None:
    import importlib.metadata

    import pytest

    from interlock.benchmarks import gpu_preflight, gpu_wheels

    assert "typing-extensions" in gpu_wheels.WHEELS
    fine = {"pytest": "8.4.1", "typing-extensions": "4.16.0"}
    assert "pytest 8.4.1" in gpu_preflight.minimum_versions(fine.__getitem__)
    with pytest.raises(RuntimeError, match=r"pytest 8\.3\.5 \(needs >= 8\.4\).*typing-extensions 4\.12\.2"):
        gpu_preflight.minimum_versions({"pytest": "8.3.5", "typing-extensions": "4.12.2"}.__getitem__)

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    with pytest.raises(RuntimeError, match="typing-extensions missing"):
        gpu_preflight.minimum_versions(missing)
