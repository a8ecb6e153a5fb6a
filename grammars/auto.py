"""The "auto" backend: llguidance first, xgrammar when llguidance cannot compile a spec.

Why this order (measured by benchmarks/grammar_bench.py on the shared JSONSchemaBench files, see
grammars/README.md): llguidance compiles in about a millisecond and refused every invalid test
instance, while xgrammar compiles in tens to hundreds of milliseconds, has a long mask-time tail
and accepts some invalid instances (grammars/LENIENCY.md). xgrammar still covers a few schemas
llguidance rejects, so it is the fallback. The error names both reasons only when both fail.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from interlock.grammars import bitmask as bm
from interlock.grammars.compiled import CompiledGrammar
from interlock.grammars.matcher import BaseMatcher
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import GrammarBackend, GrammarSpec


class AutoBackend:
    """Tries each backend in order; a compiled grammar remembers which one compiled it."""

    name = "auto"

    def __init__(self, backends: Sequence[GrammarBackend]) -> None:
        if not backends:
            raise ValueError("AutoBackend needs at least one backend")
        sizes = {b.vocab_size for b in backends}
        if len(sizes) != 1:
            raise ValueError(f"backends disagree on the vocabulary size: {sorted(sizes)}")
        self.backends = tuple(backends)
        self.vocab_size = sizes.pop()
        self._by_name = {b.name: b for b in self.backends}

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        reasons: list[str] = []
        for backend in self.backends:
            try:
                compiled = backend.compile(spec)
            except GrammarError as exc:
                reasons.append(_named(backend.name, str(exc)))
                continue
            return replace(compiled, tried=tuple(reasons))
        raise GrammarError("no backend could compile this grammar: " + "; ".join(reasons))

    def matcher(self, compiled: CompiledGrammar) -> BaseMatcher:
        backend = self._by_name.get(compiled.backend)
        if backend is None:
            raise ValueError(f"grammar was compiled by {compiled.backend}, which auto does not hold")
        return backend.matcher(compiled)

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return bm.allocate_bitmask(rows, self.vocab_size)

    def backend(self, name: str) -> Any:
        return self._by_name[name]


def _named(name: str, reason: str) -> str:
    """Backend errors already start with their name (shared checks do not); say it once."""
    return reason if reason.startswith(f"{name}:") else f"{name}: {reason}"
