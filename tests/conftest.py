"""Puts tests/ on sys.path so test files in any folder can import the shared helpers here
(`chi_square`); the test folders are not packages (importlib import mode)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# Under pytest-xdist (`make test` runs two workers, `--dist loadgroup`), tests that start process
# groups of their own (Ray clusters, torch.distributed launches) run on one worker, one at a time: two
# Ray clusters starting together on a 2-core machine miss each other's deadlines.
_OWN_PROCESSES = ("server/test_ray_", "parallel/test_launch.py", "parallel/test_group.py", "parallel/test_device_tp.py")


def pytest_collection_modifyitems(config, items) -> None:
    import pytest

    for item in items:
        if any(part in item.nodeid for part in _OWN_PROCESSES):
            item.add_marker(pytest.mark.xdist_group("own-processes"))
