"""Puts tests/ on sys.path so test files in any folder can import the shared helpers here
(`chi_square`); the test folders are not packages (importlib import mode)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
