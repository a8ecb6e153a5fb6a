"""The handle a backend's compile returns: immutable, shareable between requests and threads."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CompiledGrammar:
    """A compiled grammar for one (backend, spec, tokenizer, vocab size).

    native: the backend's object (xgrammar CompiledGrammar; a template llguidance LLMatcher that
    matchers deep-copy). warnings: everything the backend said, or we know, about what it ignored
    or approximated. inexact: the subset of warnings that mean the grammar may accept an output the
    spec refuses or refuse one it allows (`auto` uses no such grammar unless the spec is lenient).
    """

    backend: str
    spec_key: str
    native: Any = field(repr=False, compare=False)
    compile_s: float = 0.0
    warnings: tuple[str, ...] = ()
    inexact: tuple[str, ...] = ()
    tried: tuple[str, ...] = ()          # auto: reasons earlier backends refused this spec
