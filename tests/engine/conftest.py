"""Engine fixtures: models are loaded once per session; each test runs its own engine inside
`async with` (an engine's task group must be entered and left by the same task)."""
from __future__ import annotations

import pytest

from interlock.models.loader import LoadedModel, load_model

JME = "/work/shared/data/jsonschemabench/JME.jsonl"


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    return load_model("tiny")


@pytest.fixture(scope="session")
def smollm() -> LoadedModel:
    return load_model("smollm2-135m-instruct")
