"""The compiled-grammar store behind the async compile front: keys, an LRU bound, hit/miss counts.

Key: (backend name, spec key, tokenizer key, vocab size). Only successful compiles are stored
(failures are not cached). Synchronous; compiling in worker threads under a timeout, once per key,
is the async face's (actors/compile_cache.py), because `grammars/` holds no async code.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from interlock.grammars.compiled import CompiledGrammar
from interlock.protocol.grammar import GrammarBackend, GrammarSpec

CacheKey = tuple[str, str, str, int]


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    entries: int
    in_flight: int


class CompiledStore:
    """Compiled grammars of one backend and tokenizer, the least recently used dropped first."""

    def __init__(self, backend: GrammarBackend, tokenizer_key: str, max_entries: int) -> None:
        # max_entries is checked once, where the cache is made (actors/compile_cache.py)
        self.backend = backend
        self._tokenizer_key = tokenizer_key
        self._max_entries = max_entries
        self._done: OrderedDict[CacheKey, CompiledGrammar] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._done)

    def key(self, spec: GrammarSpec) -> CacheKey:
        return (self.backend.name, spec.key, self._tokenizer_key, self.backend.vocab_size)

    def lookup(self, key: CacheKey) -> CompiledGrammar | None:
        """The stored grammar (now the most recently used, and counted a hit), or None."""
        compiled = self._done.get(key)
        if compiled is not None:
            self._done.move_to_end(key)
            self.hits += 1
        return compiled

    def store(self, key: CacheKey, compiled: CompiledGrammar) -> None:
        self._done[key] = compiled
        while len(self._done) > self._max_entries:
            self._done.popitem(last=False)
