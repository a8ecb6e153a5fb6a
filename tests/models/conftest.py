"""Fixtures for model tests: the tiny preset (fast) and, once per session, the embedded SmolLM2."""
from __future__ import annotations

import pytest

from interlock.models.loader import LoadedModel, load_model


@pytest.fixture(scope="session")
def tiny_float() -> LoadedModel:
    return load_model("tiny", weights="float")


@pytest.fixture(scope="session")
def tiny_int8() -> LoadedModel:
    return load_model("tiny", weights="int8")
