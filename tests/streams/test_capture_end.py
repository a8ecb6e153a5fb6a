"""Ending a CUDA capture (streams/cuda_timeline.py's `run_all`), on the CPU: the grammar lane's join
and `capture_end` both run whatever fails, and the first error is the one raised. On an
invalidated capture the join raises too; a capture never ended leaves the stream capturing and
hides the error that said why."""
from __future__ import annotations

from interlock.streams.cuda_timeline import run_all


def steps(log: list[str], failing: set[str]):
    def step(name: str):
        def run() -> None:
            log.append(name)
            if name in failing:
                raise RuntimeError(f"{name} failed")
        return run
    return [step("join"), step("capture_end")]


def test_the_capture_ends_when_the_join_fails_and_the_join_error_is_kept() -> None:
    log: list[str] = []
    error = run_all(steps(log, {"join", "capture_end"}))
    assert log == ["join", "capture_end"]
    assert str(error) == "join failed"


def test_the_bodys_error_wins_over_the_cleanups() -> None:
    log: list[str] = []
    body = ValueError("an op the capture could not record")
    assert run_all(steps(log, {"join", "capture_end"}), body) is body
    assert log == ["join", "capture_end"]


def test_a_clean_end_returns_nothing() -> None:
    log: list[str] = []
    assert run_all(steps(log, set())) is None and log == ["join", "capture_end"]
