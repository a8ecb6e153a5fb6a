"""The public constructors: `make_backend` (sync) and `GrammarLayer` (backend + async compile cache)."""
from __future__ import annotations

from interlock.grammars.auto import AutoBackend
from interlock.grammars.cache import CompileCache
from interlock.grammars.compiled import CompiledGrammar
from interlock.grammars.llguidance_backend import LLGuidanceBackend
from interlock.grammars.matcher import BaseMatcher
from interlock.grammars.xgrammar_backend import XGrammarBackend
from interlock.models.tokenizer import Tokenizer
from interlock.protocol.grammar import BackendName, GrammarBackend, GrammarConfig, GrammarSpec

AUTO_ORDER: tuple[str, ...] = ("llguidance", "xgrammar")   # why: see grammars/auto.py


def make_backend(name: BackendName, tokenizer: Tokenizer, vocab_size: int,
                 config: GrammarConfig | None = None) -> GrammarBackend:
    """A backend for `tokenizer` whose masks are [rows, ceil(vocab_size/32)] int32.

    vocab_size is the model's vocabulary size V (>= the tokenizer's; the padding is never allowed).
    """
    config = config or GrammarConfig()
    if vocab_size < tokenizer.vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {tokenizer.vocab_size}")
    if name == "xgrammar":
        return XGrammarBackend(tokenizer, vocab_size, config)
    if name == "llguidance":
        return LLGuidanceBackend(tokenizer, vocab_size, config)
    if name == "auto":
        return AutoBackend([make_backend(n, tokenizer, vocab_size, config) for n in AUTO_ORDER])  # type: ignore[arg-type]
    raise ValueError(f"backend must be 'xgrammar', 'llguidance' or 'auto', got {name!r}")


class GrammarLayer:
    """What a GrammarActor holds: one backend, its compile cache, and matcher construction."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, config: GrammarConfig | None = None) -> None:
        self.config = config or GrammarConfig()
        self.backend = make_backend(self.config.backend, tokenizer, vocab_size, self.config)
        self.cache = CompileCache(self.backend, tokenizer.key, max_entries=self.config.cache_max_entries,
                                  timeout_s=self.config.compile_timeout_s)

    @property
    def vocab_size(self) -> int:
        return self.backend.vocab_size

    async def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compiled off the event loop, cached, deduplicated. Raises GrammarError."""
        return await self.cache.get(spec)

    async def matcher(self, spec: GrammarSpec) -> BaseMatcher:
        return self.backend.matcher(await self.compile(spec))  # type: ignore[return-value]

    def allocate_bitmask(self, rows: int):  # -> torch.Tensor [rows, ceil(V/32)] int32
        return self.backend.allocate_bitmask(rows)
