"""Async compile cache: compiles in worker threads under a timeout, once per key, into the
LRU-bounded store of grammars/compiled_store.py (keys, eviction and counts live there).

Each compile gets its own worker
thread (a fresh CapacityLimiter), so a slow or stuck compile never delays another one; on
timeout the waiters get a GrammarError and the thread is abandoned (native compiles cannot be
interrupted) and its result, if it ever comes, is dropped. Failures are not cached.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import anyio
import anyio.to_thread

from interlock.grammars.compiled_store import CacheKey, CacheStats, CompiledStore
from interlock.grammars.compiled import CompiledGrammar
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import GrammarBackend, GrammarSpec

__all__ = ["CacheKey", "CacheStats", "CompileCache"]


@dataclass
class _Pending:
    """One compile in flight; waiters block on `done` and then read result or error."""

    done: anyio.Event = field(default_factory=anyio.Event)
    result: CompiledGrammar | None = None
    error: BaseException | None = None
    abandoned: bool = False              # the owner was cancelled: a waiter must take over


class CompileCache:
    """`await cache.get(spec)` returns a CompiledGrammar for this cache's backend."""

    def __init__(self, backend: GrammarBackend, tokenizer_key: str, *, max_entries: int = 256,
                 timeout_s: float = 10.0) -> None:
        if max_entries <= 0 or timeout_s <= 0:
            raise ValueError("max_entries and timeout_s must be positive")
        self.backend = backend
        self._store = CompiledStore(backend, tokenizer_key, max_entries)
        self._timeout_s = timeout_s
        self._pending: dict[CacheKey, _Pending] = {}

    def key(self, spec: GrammarSpec) -> CacheKey:
        return self._store.key(spec)

    def stats(self) -> CacheStats:
        return CacheStats(self._store.hits, self._store.misses, len(self._store), len(self._pending))

    async def get(self, spec: GrammarSpec) -> CompiledGrammar:
        """The compiled grammar for spec. Raises GrammarError (bad spec, or compile timeout)."""
        key = self.key(spec)
        while True:
            compiled = self._store.lookup(key)
            if compiled is not None:
                return compiled
            pending = self._pending.get(key)
            if pending is None:
                return await self._compile(key, spec)
            await pending.done.wait()
            if pending.abandoned:
                continue                         # the owner was cancelled; try again ourselves
            if pending.error is not None:
                raise pending.error
            assert pending.result is not None    # set together with done (internal invariant)
            return pending.result

    async def _compile(self, key: CacheKey, spec: GrammarSpec) -> CompiledGrammar:
        self._store.misses += 1
        pending = self._pending[key] = _Pending()
        try:
            compiled = await self._run_with_timeout(spec)
        except GrammarError as exc:
            pending.error = exc
            raise
        except BaseException:                    # cancelled (or a bug): let a waiter retry
            pending.abandoned = True
            raise
        else:
            pending.result = compiled
            self._store.store(key, compiled)
            return compiled
        finally:
            del self._pending[key]
            pending.done.set()

    async def _run_with_timeout(self, spec: GrammarSpec) -> CompiledGrammar:
        with anyio.move_on_after(self._timeout_s):
            return await anyio.to_thread.run_sync(
                self.backend.compile, spec, abandon_on_cancel=True, limiter=anyio.CapacityLimiter(1))
        raise GrammarError(f"{self.backend.name}: compiling the grammar timed out after "
                           f"{self._timeout_s:g} s (GrammarConfig.compile_timeout_s)")
