"""Shared fixtures for the grammar tests: backends (and the real tokenizer), built once per session;
the tiny tokenizer is tests/conftest.py's."""
from __future__ import annotations

import pytest

from interlock.grammars import make_backend
from interlock.models.loader import TINY_PADDED_VOCAB, load_tokenizer

BACKENDS = ("xgrammar", "llguidance")


@pytest.fixture(scope="session")
def big_tokenizer():
    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tiny_backends(tiny_tokenizer):
    """name -> backend over the tiny tokenizer (1024 ids) with the tiny model's V = 1088."""
    return {n: make_backend(n, tiny_tokenizer, TINY_PADDED_VOCAB) for n in (*BACKENDS, "auto")}


@pytest.fixture(scope="session")
def big_backends(big_tokenizer):
    """name -> backend over the real SmolLM2 tokenizer, V = 49152."""
    return {n: make_backend(n, big_tokenizer, big_tokenizer.vocab_size) for n in BACKENDS}
