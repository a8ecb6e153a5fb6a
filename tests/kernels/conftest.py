"""Shared fixtures for the kernel tests: seeded generators and random grammar bitmasks."""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch


@pytest.fixture
def gen() -> torch.Generator:
    """A fresh generator with a fixed seed, so every test is deterministic."""
    return torch.Generator().manual_seed(1234)


@pytest.fixture
def random_bitmask() -> Callable[..., torch.Tensor]:
    """Make an int32 [rows, ceil(vocab/32)] bitmask with each bit set with probability `density`."""

    def make(rows: int, vocab: int, gen: torch.Generator, density: float = 0.5) -> torch.Tensor:
        words = (vocab + 31) // 32
        bits = (torch.rand(rows, words, 32, generator=gen) < density).long()  # [rows, W, 32]
        packed = (bits << torch.arange(32)).sum(-1)  # [rows, W] in [0, 2**32)
        return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)

    return make
