"""Where the tests read JSONSchemaBench: the slice vendored in tests/data/jsonschemabench (its README
says which rows, from where, under what terms). Never the full sets (benchmarks/prompts.full_sets),
which a user's clone does not have."""
from __future__ import annotations

from pathlib import Path

JSONSCHEMABENCH = Path(__file__).parent / "data" / "jsonschemabench"
