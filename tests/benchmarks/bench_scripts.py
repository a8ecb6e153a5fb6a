"""Running a benchmark script's main() inside the test process."""
from __future__ import annotations

import sys
from types import ModuleType

import pytest


def run_main(script: ModuleType, argv: list[str], monkeypatch: pytest.MonkeyPatch, model: object = None) -> None:
    """script.main() with these arguments. main() configures logging and torch's threads for a process
    of its own, not this one's: both are stubbed; `model`, when given, is what its load_model returns."""
    if model is not None:
        monkeypatch.setattr(script, "load_model", lambda name: model)
    monkeypatch.setattr(script, "configure_logging", lambda **kw: None)
    monkeypatch.setattr(script.torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(sys, "argv", [script.__name__.rsplit(".", 1)[-1], *argv])
    script.main()


def usage_error(script: ModuleType, argv: list[str], monkeypatch: pytest.MonkeyPatch,
                capsys: pytest.CaptureFixture[str]) -> str:
    """script.main() with these arguments must stop with argparse's usage status (2): its stderr."""
    monkeypatch.setattr(sys, "argv", [script.__name__.rsplit(".", 1)[-1], *argv])
    with pytest.raises(SystemExit) as exit_info:
        script.main()
    assert exit_info.value.code == 2
    return capsys.readouterr().err
