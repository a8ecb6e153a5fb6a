"""Shared fixtures for interlock.testing's tests: tokenizers and backends, built once per session."""
from __future__ import annotations

import pytest

from interlock.grammars import make_backend
from interlock.models.loader import TINY_PADDED_VOCAB
from interlock.testing import byte_tokenizer

BACKENDS = ("xgrammar", "llguidance")


@pytest.fixture(scope="session")
def byte_tok():
    return byte_tokenizer()


@pytest.fixture(scope="session")
def byte_backends(byte_tok):
    """name -> backend over the byte-level tokenizer, V = its vocabulary."""
    return {n: make_backend(n, byte_tok, byte_tok.vocab_size) for n in BACKENDS}


@pytest.fixture(scope="session")
def tiny_backends(tiny_tokenizer):
    """name -> backend over the tiny tokenizer (1024 ids) with the tiny model's padded V = 1088."""
    return {n: make_backend(n, tiny_tokenizer, TINY_PADDED_VOCAB) for n in BACKENDS}
