"""grammars/stderr.py: native log lines on fd 2 are captured, other lines pass through, and a
capture never waits long behind another one."""
from __future__ import annotations

import os
import threading

import pytest

from interlock.grammars import stderr as capture


def test_native_lines_are_captured_and_others_pass_through(capfd):
    def noisy() -> int:
        os.write(2, b"[05:03:24] /project/cpp/json_schema_converter.cc:832: Warning: oneOf as anyOf\n")
        os.write(2, b"a line from someone else\n")
        return 7

    result, lines = capture.call_capturing_stderr(noisy)
    assert result == 7 and lines == ["Warning: oneOf as anyOf"]
    err = capfd.readouterr().err
    assert "a line from someone else" in err and "oneOf" not in err


def test_errors_propagate_and_stderr_is_restored(capfd):
    def fails() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        capture.call_capturing_stderr(fails)
    os.write(2, b"after\n")
    assert "after" in capfd.readouterr().err


def test_a_held_capture_makes_the_next_one_run_uncaptured():
    release, holding = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        release.wait(10)

    thread = threading.Thread(target=capture.call_capturing_stderr, args=(hold,))
    thread.start()
    try:
        assert holding.wait(10)
        assert capture.call_capturing_stderr(lambda: 1, wait_s=0.05) == (1, None)
    finally:
        release.set()
        thread.join()
