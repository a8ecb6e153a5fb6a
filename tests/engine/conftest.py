"""Engine fixtures (the models are tests/conftest.py's, one per session); each test runs its own
engine inside `async with` (an engine's task group must be entered and left by the same task)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))     # for `import helpers` (importlib import mode)


@pytest.fixture(autouse=True)
def _gpu_check_step_timeout(monkeypatch) -> None:
    """Under make gpu-check (INTERLOCK_TEST_STEP_TIMEOUT_S, benchmarks/gpu_check.py): every engine's
    step timeout at most that, so a hung step fails its test with stacks before the part is killed."""
    limit = os.environ.get("INTERLOCK_TEST_STEP_TIMEOUT_S")
    if not limit:
        return
    from dataclasses import replace

    from interlock.engine import engine as engine_module

    init = engine_module.Engine.__init__

    def bounded(self, loaded, config=engine_module.EngineConfig(), *args, **kwargs) -> None:
        init(self, loaded, replace(config, step_timeout_s=min(config.step_timeout_s, float(limit))), *args, **kwargs)

    monkeypatch.setattr(engine_module.Engine, "__init__", bounded)


@pytest.fixture(scope="session")
def alone(tiny) -> dict[int, tuple[int, ...]]:
    """Output of each tiny-preset test case run alone (batch 1), computed once."""
    import anyio

    from helpers import alone_outputs

    return anyio.run(alone_outputs, tiny, 20)
