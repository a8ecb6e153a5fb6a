"""GrammarLayer: the engine's async front to the grammar backends: the backends requests choose
(built on first use, off the event loop), one CompileCache per backend, and the router the
GrammarActor makes matchers with."""
from __future__ import annotations

import threading
from collections.abc import Mapping
from types import MappingProxyType

import anyio
import anyio.to_thread

from interlock.actors.compile_cache import CompileCache
from interlock.grammars.auto import AutoBackend
from interlock.grammars.backends import AUTO_ORDER, BackendRouter, make_backend
from interlock.grammars.compiled import CompiledGrammar
from interlock.grammars.matcher import BaseMatcher
from interlock.models.tokenizer import Tokenizer
from interlock.protocol.errors import InvalidParameterError
from interlock.protocol.grammar import BACKENDS, BackendName, GrammarBackend, GrammarConfig, GrammarSpec


class GrammarLayer:
    """What the engine holds for grammars: its default backend, the backends requests choose
    (built on first use, sharing instances with `auto`), one compile cache per backend, and the
    router the GrammarActor makes matchers with (any compiled grammar, whichever backend made it)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, config: GrammarConfig | None = None) -> None:
        self.config = config or GrammarConfig()
        self._tokenizer, self._vocab_size = tokenizer, vocab_size
        self._backends: dict[str, GrammarBackend] = {}
        self._caches: dict[str, CompileCache] = {}
        self._building = threading.RLock()        # a backend is built once, even by two compile threads
        self.router = BackendRouter(self._backends)
        self.backend = self._backend(self.config.backend)

    @property
    def cache(self) -> CompileCache:
        """The default backend's compile cache."""
        return self._caches[self.config.backend]

    @property
    def caches(self) -> Mapping[str, CompileCache]:
        """Each built backend's compile cache, by backend name (read-only view)."""
        return MappingProxyType(self._caches)

    @property
    def vocab_size(self) -> int:
        return self.backend.vocab_size

    @staticmethod
    def check_name(name: str) -> None:
        """InvalidParameterError unless `name` is a backend a request may choose."""
        if name not in BACKENDS:
            raise InvalidParameterError("grammar_backend", f"must be one of {', '.join(BACKENDS)}, got {name!r}")

    def _backend(self, name: str, lazy: bool = False) -> GrammarBackend:
        """The backend `name`, built once; `auto` wraps the concrete ones it shares with requests,
        its fallbacks lazy (make_backend says why)."""
        self.check_name(name)
        with self._building:
            found = self._backends.get(name)
            if found is not None:
                return found
            if name == "auto":
                backend: GrammarBackend = AutoBackend([self._backend(n, lazy=i > 0) for i, n in enumerate(AUTO_ORDER)])
            else:
                backend = make_backend(name, self._tokenizer, self._vocab_size, self.config,  # type: ignore[arg-type]
                                       lazy=lazy)
            self._backends[name] = backend       # first: a cache (so a grammar) never exists without it
            self._caches[name] = CompileCache(backend, self._tokenizer.key,
                                              max_entries=self.config.cache_max_entries,
                                              timeout_s=self.config.compile_timeout_s)
            return backend

    async def compile(self, spec: GrammarSpec, backend: BackendName | None = None) -> CompiledGrammar:
        """Compiled by `backend` (None: the engine's), off the event loop, cached per backend,
        deduplicated. Raises GrammarError, or InvalidParameterError for an unknown backend name."""
        name = backend or self.config.backend
        if name not in self._caches:
            # Building a backend reads the whole vocabulary (~0.5 s for 49k ids): not on the loop.
            await anyio.to_thread.run_sync(self._backend, name)
        return await self._caches[name].get(spec)

    async def matcher(self, spec: GrammarSpec, backend: BackendName | None = None) -> BaseMatcher:
        return self.router.matcher(await self.compile(spec, backend))

    def allocate_bitmask(self, rows: int):  # -> torch.Tensor [rows, ceil(V/32)] int32
        return self.backend.allocate_bitmask(rows)
