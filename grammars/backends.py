"""Backend construction (`make_backend`) and the `BackendRouter` that makes a matcher for a compiled
grammar of any backend. Synchronous; the async compile front (GrammarLayer, CompileCache) lives in
actors/, where `async def` belongs (ARCHITECTURE: the sync/async dividing line)."""
from __future__ import annotations

from interlock.grammars.auto import AutoBackend
from interlock.grammars.compiled import CompiledGrammar
from interlock.grammars.llguidance_backend import LLGuidanceBackend
from interlock.grammars.matcher import BaseMatcher
from interlock.grammars.switch import SwitchMatcher
from interlock.grammars.xgrammar_backend import XGrammarBackend
from interlock.models.tokenizer import Tokenizer
from interlock.protocol.grammar import AUTO_ORDER, BackendName, GrammarBackend, GrammarConfig


def make_backend(name: BackendName, tokenizer: Tokenizer, vocab_size: int,
                 config: GrammarConfig | None = None, *, lazy: bool = False) -> GrammarBackend:
    """A backend for `tokenizer` whose masks are [rows, ceil(vocab_size/32)] int32.

    vocab_size is the model's vocabulary size V (>= the tokenizer's; the padding is never allowed).
    lazy: build what the backend reads from the vocabulary on its first compile, not now (xgrammar's;
    llguidance is `auto`'s first choice, so it is always built). `auto` makes its fallbacks lazy:
    most engines never reach them.
    """
    config = config or GrammarConfig()
    if vocab_size < tokenizer.vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {tokenizer.vocab_size}")
    if name == "xgrammar":
        return XGrammarBackend(tokenizer, vocab_size, config, lazy=lazy)
    if name == "llguidance":
        return LLGuidanceBackend(tokenizer, vocab_size, config)
    if name == "auto":
        return AutoBackend([make_backend(n, tokenizer, vocab_size, config, lazy=i > 0)
                            for i, n in enumerate(AUTO_ORDER)])
    raise ValueError(f"backend must be 'xgrammar', 'llguidance' or 'auto', got {name!r}")


class BackendRouter:
    """Matchers for compiled grammars of any backend the layer built: each goes to the backend that
    compiled it (`compiled.backend`, which `auto` sets to its own name for switches and to the
    concrete backend otherwise). Read on the grammar lane; a backend is always registered before
    any grammar it compiled exists."""

    def __init__(self, backends: dict[str, GrammarBackend]) -> None:
        self._backends = backends

    def matcher(self, compiled: CompiledGrammar) -> BaseMatcher | SwitchMatcher:
        backend = self._backends.get(compiled.backend)
        if backend is None:
            raise ValueError(f"grammar was compiled by {compiled.backend!r}, which this engine has not built")
        return backend.matcher(compiled)  # type: ignore[return-value]
