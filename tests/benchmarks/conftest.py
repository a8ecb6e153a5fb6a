"""Puts this folder on sys.path for `import bench_scripts` (importlib import mode)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
