"""What a property test is about: one grammar, compiled once for one backend and tokenizer.

`GrammarCase` is frozen and holds no per-example state, so strategies and state machines can share
one across every hypothesis example; each example makes its own matchers with `case.matcher()`.
`Tokens` and `Refused` are what the strategies produce; their reprs show the decoded text next to
the ids, so a shrunk counterexample reads as text.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from interlock.grammars.bitmask import allowed_ids
from interlock.grammars.backends import make_backend
from interlock.models.tokenizer import Tokenizer
from interlock.protocol.grammar import BackendName, GrammarBackend, GrammarMatcher, GrammarSpec
from interlock.protocol.types import TokenId

MatcherFactory = Callable[["GrammarCase"], GrammarMatcher]


@dataclass(frozen=True)
class GrammarCase:
    """A compiled grammar plus how to make the matcher under test.

    matcher_factory: None tests the backend's own matcher; otherwise a function of this case that
    returns the matcher to test, e.g. `lambda case: MyWrapper(case.backend.matcher(case.compiled))`.
    Every check compares that matcher with a fresh one from the same factory replaying the
    accepted prefix, so what is tested is the matcher's own consistency (rollback exactness).
    """

    spec: GrammarSpec
    backend: GrammarBackend
    compiled: Any
    tokenizer: Tokenizer
    matcher_factory: MatcherFactory | None = None

    @property
    def vocab_size(self) -> int:
        """V: the mask width (the model's vocabulary, may exceed the tokenizer's)."""
        return self.backend.vocab_size

    def matcher(self) -> GrammarMatcher:
        """A new matcher at the grammar's start."""
        if self.matcher_factory is None:
            return self.backend.matcher(self.compiled)
        return self.matcher_factory(self)

    def replay(self, ids: Sequence[TokenId]) -> GrammarMatcher | None:
        """A new matcher that accepted ids, or None when it refuses them."""
        matcher = self.matcher()
        return matcher if matcher.accept(list(ids)) else None

    def allowed(self, matcher: GrammarMatcher) -> list[TokenId]:
        """Sorted ids matcher's mask allows now (fills a scratch row)."""
        mask = self.backend.allocate_bitmask(1)
        matcher.fill_mask(mask, 0)
        return allowed_ids(mask, 0, self.vocab_size)

    @cached_property
    def frequency_rank(self) -> torch.Tensor:
        """[V] int64: each id's place in a most-frequent-first order, computed once per case.

        The proxy for frequency: tokens whose text is printable ASCII come first (in BPE, bytes
        and early merges, i.e. low ids, are the frequent ones), then the rest (byte fragments of
        UTF-8 characters, rare scripts), then padding ids; by id within each group.
        """
        n = min(self.tokenizer.vocab_size, self.vocab_size)
        texts = self.tokenizer.hf.batch_decode([[i] for i in range(n)])
        plain = torch.tensor([bool(t) and all(" " <= c <= "~" or c in "\n\t" for c in t) for t in texts]
                             + [False] * (self.vocab_size - n))                    # [V]
        group = torch.where(plain, 0, 1) + (torch.arange(self.vocab_size) >= n).long()  # [V] 0, 1, 2
        order = torch.argsort(group * self.vocab_size + torch.arange(self.vocab_size))   # [V]
        rank = torch.empty_like(order)
        rank[order] = torch.arange(self.vocab_size)
        return rank

    def by_frequency(self, ids: Sequence[TokenId]) -> list[TokenId]:
        """ids reordered most frequent first (see frequency_rank)."""
        if not ids:
            return []
        t = torch.tensor(list(ids), dtype=torch.long)                                     # [n]
        return t[torch.argsort(self.frequency_rank[t])].tolist()

    def tokens(self, ids: Sequence[TokenId]) -> Tokens:
        return Tokens(tuple(int(t) for t in ids), self.text(ids))

    def text(self, ids: Sequence[TokenId]) -> str:
        """Decoded text; ids the tokenizer does not know (padding, negative) show as <id>."""
        known = self.tokenizer.vocab_size
        parts, run = [], []
        for t in ids:
            if 0 <= t < known:
                run.append(int(t))
                continue
            parts += [self.tokenizer.decode(run), f"<{t}>"]
            run = []
        return "".join([*parts, self.tokenizer.decode(run)])


@dataclass(frozen=True)
class Tokens:
    """A token sequence; prints as its text and ids."""

    ids: tuple[TokenId, ...]
    text: str

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"Tokens({self.text!r}, ids={list(self.ids)})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))           # hypothesis prints dataclasses field by field otherwise


@dataclass(frozen=True)
class Refused:
    """A prefix the grammar allows, then one token it refuses right after it."""

    prefix: Tokens
    token: TokenId
    token_text: str

    @property
    def ids(self) -> tuple[TokenId, ...]:
        return (*self.prefix.ids, self.token)

    def __repr__(self) -> str:
        return f"Refused({self.prefix!r} then {self.token} {self.token_text!r})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


def grammar_case(spec: GrammarSpec, backend: BackendName | GrammarBackend = "xgrammar",
                 tokenizer: Tokenizer | str | None = None, *, vocab_size: int | None = None,
                 matcher_factory: MatcherFactory | None = None) -> GrammarCase:
    """Compile spec once for property tests. Raises GrammarError when the backend cannot compile it.

    backend: a name ("xgrammar", "llguidance", "auto") or a backend you built (reuse one across
    cases: building a backend tokenizes the whole vocabulary). tokenizer: a `Tokenizer`, a name for
    `interlock.models.loader.load_tokenizer` ("tiny", "smollm2-135m-instruct", a path), or None for
    the small byte-level tokenizer. vocab_size: V for a backend built here (default: the tokenizer's).
    """
    if isinstance(backend, str):
        tok = _resolve_tokenizer(tokenizer)
        built = make_backend(backend, tok, vocab_size or tok.vocab_size)
    else:
        built = backend
        tokenizer = tokenizer if tokenizer is not None else getattr(backend, "tokenizer", None)
        if tokenizer is None:
            raise ValueError("pass the tokenizer this backend was built for (it has no .tokenizer)")
        tok = _resolve_tokenizer(tokenizer)
        if vocab_size is not None and vocab_size != built.vocab_size:
            raise ValueError(f"vocab_size {vocab_size} differs from the backend's {built.vocab_size}")
    return GrammarCase(spec, built, built.compile(spec), tok, matcher_factory)


def _resolve_tokenizer(tokenizer: Tokenizer | str | None) -> Tokenizer:
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    if tokenizer is None:
        from interlock.testing.tokenizers import byte_tokenizer

        return byte_tokenizer()
    from interlock.models.loader import load_tokenizer

    return load_tokenizer(tokenizer)
