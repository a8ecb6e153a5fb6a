"""The "auto" backend: llguidance first, xgrammar when llguidance cannot compile a spec, and for a
JSON schema only a grammar that enforces it exactly.

Why this order (measured by benchmarks/grammar_bench.py on the shared JSONSchemaBench files, see
docs/grammars.md): llguidance compiles in about a millisecond and refuses at compile time the
keywords it cannot enforce, while xgrammar compiles in tens to hundreds of milliseconds, has a long
mask-time tail and silently drops keywords (grammars/LENIENCY.md). xgrammar still enforces a few
schemas llguidance refuses (min/maxProperties beside optional properties, some regexes), so it is
the fallback, used only where grammars/keywords.py finds no gap and xgrammar warns of none.

Where neither backend is exact, compile raises SchemaKeywordError naming the keyword, unless the
spec is `lenient`: then llguidance compiles it with its own lenient options (else xgrammar does)
and the engine's end-of-request check (grammars/validate.py) catches what the grammar let through.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from interlock.grammars import bitmask as bm
from interlock.grammars.checks import check_spec
from interlock.grammars.compiled import CompiledGrammar
from interlock.grammars.keywords import Gap, gap_named, gaps, no_backend_error, said_by
from interlock.grammars.switch import SwitchMatcher, SwitchProgram, compile_switch, is_switch
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import GrammarBackend, GrammarConfig, GrammarMatcher, GrammarSpec, JsonSchema


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

    @property
    def token_bytes(self) -> tuple[bytes, ...] | None:
        """The first backend's token bytes (switching grammars read them), read when they are."""
        return getattr(self.backends[0], "token_bytes", None)

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        if is_switch(spec) and not spec.native:  # type: ignore[union-attr]
            # Each inner spec goes through auto on its own (exactness policy and fallback per tag).
            return compile_switch(self, self.backends[0].tokenizer, spec)  # type: ignore[arg-type, attr-defined]
        # The shared checks fail the spec itself (a schema its meta-schema refuses, a cap): said
        # as such, not as a keyword each backend would then be said to lack.
        check_spec(spec, getattr(self.backends[0], "config", None) or GrammarConfig())
        exact = isinstance(spec, JsonSchema) and not spec.lenient
        schema = json.loads(spec.compiled_schema) if exact else None      # type: ignore[union-attr]
        reasons: list[str] = []
        named: list[Gap] = []          # the keyword behind each backend's refusal, in backend order
        for backend in self.backends:
            found = gaps(schema, backend.name) if exact else ()
            if found:                  # known before compiling: skip a slow compile we would not use
                named.append(found[0])
                reasons.append(f"{backend.name} does not enforce " + "; ".join(map(str, found[:3])))
                continue
            try:
                compiled = backend.compile(spec)
            except GrammarError as exc:
                named += gap_named(schema, str(exc)) if exact else []
                reasons.append(said_by(backend.name, str(exc)))
                continue
            if exact and compiled.inexact:
                named += gap_named(schema, compiled.inexact[0])
                reasons.append(said_by(backend.name, "; ".join(compiled.inexact[:3])))
                continue
            return replace(compiled, tried=tuple(reasons))
        raise no_backend_error(named, reasons)

    def matcher(self, compiled: CompiledGrammar) -> GrammarMatcher:
        if isinstance(compiled.native, SwitchProgram):      # its inner grammars name their backends
            return SwitchMatcher(compiled.native, self, self.backends[0].tokenizer)  # type: ignore[attr-defined]
        backend = self._by_name.get(compiled.backend)
        if backend is None:
            raise ValueError(f"grammar was compiled by {compiled.backend}, which auto does not hold")
        return backend.matcher(compiled)

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return bm.allocate_bitmask(rows, self.vocab_size)

    def backend(self, name: str) -> Any:
        return self._by_name[name]
