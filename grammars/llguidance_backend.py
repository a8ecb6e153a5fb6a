"""llguidance behind the matcher protocol.

Compiling builds one template LLMatcher (grammar parsed and checked against the tokenizer); each
request's matcher is a deep copy of it, which is much cheaper than parsing again. An LLMatcher
that consumes a refused token enters a permanent error state, so BaseMatcher validates first.

JSON schemas: llguidance refuses keywords it cannot enforce (not, if/then/else, contains, ...)
and a `format` it does not know. Formats are annotations by default in JSON Schema 2020-12, so an
unknown one is dropped here with a warning instead (as the spec reads it: it constrains nothing).
With `JsonSchema(lenient=True)` llguidance's own `lenient` and `coerce_one_of` options are on: it
ignores unimplemented keywords and treats oneOf as anyOf, each with a warning.

llguidance's tokenizer (`ll_tokenizer`) is built from the HF tokenizer once per vocabulary; the bytes
of its trie are then kept (grammars/tables.py) and later starts build the same tokenizer from them.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from importlib.metadata import version
from typing import Any

import llguidance
import llguidance.hf
import torch

from interlock.grammars import bitmask as bm
from interlock.grammars import llguidance_calls
from interlock.grammars import tables
from interlock.grammars.checks import check_spec
from interlock.grammars.compiled import CompiledGrammar
from interlock.grammars.keywords import ref_siblings
from interlock.grammars.llguidance_text import first_line, grammar_text
from interlock.grammars.matcher import BaseMatcher
from interlock.grammars.native_tags import check_native, llguidance_grammar
from interlock.grammars.switch import SwitchMatcher, SwitchProgram, compile_switch, is_switch
from interlock.models.tokenizer import Tokenizer
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import GrammarConfig, GrammarSpec, JsonSchema
from interlock.protocol.types import TokenId
from interlock.logs import get_logger

NAME = "llguidance"
log = get_logger(__name__)


class LLGuidanceBackend:
    """Compiles specs into template LLMatchers for one tokenizer and vocabulary size V."""

    name = NAME

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, config: GrammarConfig | None = None) -> None:
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.config = config or GrammarConfig()
        self._tok, self._trie = ll_tokenizer(tokenizer, vocab_size)

    @cached_property
    def token_bytes(self) -> tuple[bytes, ...]:
        """The bytes of each token, as llguidance decodes it: switching grammars match their triggers
        on them (grammars/triggers.py). Read on first use: only they need it."""
        if self._trie is None:
            return tuple(self._tok.decode_bytes([i]) for i in range(self.tokenizer.vocab_size))
        return tuple(decoded(self._trie[i], i) for i in range(self.tokenizer.vocab_size))

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        if is_switch(spec) and not spec.native:  # type: ignore[union-attr]  # grammars/switch/
            return compile_switch(self, self.tokenizer, spec)  # type: ignore[arg-type]
        start = time.perf_counter()
        ours: list[str] = []
        if is_switch(spec):                      # native=True: one Lark grammar (grammars/native_tags.py)
            check_native(spec, self.tokenizer, NAME)  # type: ignore[arg-type]
            grammar = llguidance_grammar(spec, lambda inner: self._sub_grammar(inner, ours))  # type: ignore[arg-type]
        else:
            check_spec(spec, self.config)
            grammar = grammar_text(spec, ours)
        try:
            template = llguidance.LLMatcher(self._tok, grammar, log_level=0)
        except Exception as exc:                 # misuse-level errors (bad grammar JSON)
            raise GrammarError(f"llguidance: {first_line(exc)}") from exc
        if template.is_error():
            raise GrammarError(f"llguidance: {first_line(template.get_error())}")
        # llguidance warns only when it approximates (lenient mode, coerce_one_of): each is inexact.
        inexact = [f"llguidance: {w}" for w in template.get_grammar_warnings()]
        if isinstance(spec, JsonSchema):
            for where, keys in ref_siblings(json.loads(spec.compiled_schema)):
                log.debug("grammar.ref_siblings_applied", backend=NAME, path=where or "/", keywords=keys,
                          why="draft-07 ignores keywords beside '$ref'; applied, every output still satisfies it")
        warnings = (*ours, *inexact)
        for warning in warnings:
            log.warning("grammar.backend_warning", backend=NAME, warning=warning)
        return CompiledGrammar(NAME, spec.key, template, time.perf_counter() - start, warnings, tuple(inexact))

    def matcher(self, compiled: CompiledGrammar) -> LLGuidanceMatcher | SwitchMatcher:
        if compiled.backend != NAME:
            raise ValueError(f"grammar was compiled by {compiled.backend}, not {NAME}")
        if isinstance(compiled.native, SwitchProgram):
            return SwitchMatcher(compiled.native, self, self.tokenizer)
        return LLGuidanceMatcher(compiled.native.deep_copy(), self)

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return bm.allocate_bitmask(rows, self.vocab_size)

    def _sub_grammar(self, spec: GrammarSpec, warnings: list[str]) -> dict:
        """A plain spec's grammar as one entry of a larger llguidance grammar."""
        check_spec(spec, self.config)
        text = grammar_text(spec, warnings)
        try:
            entries = json.loads(text)["grammars"]
        except json.JSONDecodeError:             # some helpers hand back Lark text
            entries = [{"lark_grammar": text}]
        if len(entries) != 1:
            raise GrammarError(f"llguidance: a {type(spec).__name__} part cannot be nested in a native "
                               f"switching grammar")
        return entries[0]

TRIE_TABLE = "llguidance-trie"
SPECIAL = 0xFF          # llguidance's marker before a special token's name in its trie (TokTrie::SPECIAL_TOKEN_MARKER)


def ll_tokenizer(tokenizer: Tokenizer, vocab_size: int) -> tuple[Any, tuple[bytes, ...] | None]:
    """llguidance's tokenizer over V ids, and the bytes its trie holds for each id (None where they
    were not read). The first time, llguidance.hf.from_tokenizer builds it (it parses the whole
    tokenizer again in Rust: ~4 s at 262k ids) and its trie's bytes are kept; after that the same
    tokenizer is made from the kept bytes, llguidance asking the HF tokenizer itself for the
    tokenizations it needs (forced text), as it would ask its own copy. Tokenizers whose text
    llguidance tokenizes differently from the HF tokenizer (see `encodes_as_is`) always take the first way."""
    eos = list(tokenizer.eos_token_ids)
    parts = (version("llguidance"), vocab_size, tuple(eos))
    if not eos or not encodes_as_is(tokenizer.hf):
        return llguidance.hf.from_tokenizer(tokenizer.hf, n_vocab=vocab_size, eos_token=eos), None
    kept = tables.load(tokenizer, TRIE_TABLE, parts)
    if kept is not None:
        try:
            trie = tables.unpack_bytes(kept)
            if len(trie) == vocab_size:
                backend = tokenizer.hf.backend_tokenizer
                return llguidance.LLTokenizer(TrieTokens(list(trie), eos[0], _encoder(backend)), eos_token=eos), trie
        except ValueError:
            pass                                 # not a table of ours after all: built again below
    built = llguidance.hf.from_tokenizer(tokenizer.hf, n_vocab=vocab_size, eos_token=eos)
    trie = trie_bytes(built, vocab_size)
    tables.save(tokenizer, TRIE_TABLE, parts, tables.pack_bytes(trie))
    return built, trie


@dataclass
class TrieTokens(llguidance.TokenizerWrapper):
    """A tokenizer as llguidance.LLTokenizer reads one from Python (its TokenizerWrapper protocol):
    the bytes of each id (special ones already marked), the first stop id, and a callable that
    tokenizes a text. A TokenizerWrapper by class too, as LLTokenizer's signature names it; its
    own fields replace the wrapper's __init__, which would read them from an HF tokenizer."""

    tokens: list[bytes]
    eos_token_id: int
    encode: Callable[[str], list[int]]
    bos_token_id: int | None = None              # llguidance does not use it
    special_token_ids: list[int] = field(default_factory=list)   # none to mark: `tokens` carry the marker
    is_tokenizer_wrapper: bool = True

    def __call__(self, text: str) -> list[int]:
        return self.encode(text)


def _encoder(backend: Any) -> Callable[[str], list[int]]:
    # what llguidance's own copy answers: encode(text, add_special_tokens=False)
    return lambda text: backend.encode(text, add_special_tokens=False).ids


def trie_bytes(ll: Any, vocab_size: int) -> tuple[bytes, ...]:
    """The bytes llguidance's trie holds for each of V ids, read back through what it exposes:
    decode_bytes drops a special token's marker and spells an empty token "<[id]>"."""
    def raw(i: int) -> bytes:
        text = ll.decode_bytes([i])
        if ll.is_special_token(i):
            return bytes([SPECIAL]) + text
        return b"" if text == b"<[%d]>" % i else text
    return tuple(raw(i) for i in range(vocab_size))


def decoded(raw: bytes, token: int) -> bytes:
    """What llguidance's decode_bytes([token]) gives for a token whose trie bytes are `raw`."""
    if not raw:
        return b"<[%d]>" % token
    return raw[1:] if raw[0] == SPECIAL else raw


def encodes_as_is(hf: Any) -> bool:
    """Whether llguidance tokenizes with `hf`'s Rust tokenizer unchanged. It drops a Prepend
    normalizer and a Metaspace pre-tokenizer's prepending (it tokenizes text from mid-sentence), and
    padding and truncation: a tokenizer with any of them it must read itself."""
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None or backend.truncation is not None or backend.padding is not None:
        return False
    parts = [json.loads(p.__getstate__()) for p in (backend.normalizer, backend.pre_tokenizer) if p is not None]
    return not any(_prepends(p) for p in parts)


def _prepends(part: object) -> bool:
    if isinstance(part, list):
        return any(_prepends(p) for p in part)
    if not isinstance(part, dict):
        return False
    if part.get("type") == "Prepend" or (part.get("type") == "Metaspace" and part.get("prepend_scheme") != "never"):
        return True
    return any(_prepends(v) for v in part.values())


class LLGuidanceMatcher(BaseMatcher):
    def __init__(self, native: Any, backend: LLGuidanceBackend) -> None:
        super().__init__(vocab_size=backend.vocab_size, tokenizer_vocab=backend.tokenizer.vocab_size,
                         eos_token_ids=backend.tokenizer.eos_token_ids)
        self._m = native
        self._initial = native.deep_copy()         # reset() restores this; no re-parse
        self._scratch = bm.allocate_bitmask(1, backend.vocab_size)
        # The tokens the native matcher holds: a mask computed where no token can extend the output
        # (Choice(["0\x06"]) after "0" on a vocabulary without "\x06") leaves llguidance stopped
        # with an error, and a stopped matcher refuses rollback; _rewind rebuilds it from these.
        self._tokens: list[TokenId] = []

    def _native_validate(self, token_ids: list[TokenId]) -> int:
        """llguidance's own check, narrowed to what its mask allows.

        validate_tokens also takes non-canonical tokenizations that the mask forbids (after `{"`
        it takes "na" while the mask offers only "name"). The mask is what a model samples from,
        so it is the contract: each token must also be allowed by the mask of the state before it.
        """
        n = self._m.validate_tokens(token_ids)
        consumed = 0
        try:
            for t in token_ids[:n]:
                llguidance_calls.fill_next_token_bitmask(self._m, self._scratch, 0)
                if not bm.is_allowed(self._scratch, 0, t):
                    break
                self._m.consume_tokens([t])
                consumed += 1
        finally:
            self._rewind(consumed)
        return consumed

    def _native_consume(self, token_ids: list[TokenId]) -> None:
        if not self._m.consume_tokens(token_ids):
            raise RuntimeError(f"llguidance refused validated tokens: {self._m.get_error()}")
        self._tokens.extend(token_ids)

    def _native_rollback(self, n: int) -> None:
        del self._tokens[len(self._tokens) - n:]
        self._rewind(n)

    def _rewind(self, n: int) -> None:
        """Roll the native matcher back n tokens, to the state after self._tokens; a stopped one
        (see __init__) is rebuilt from the initial state instead."""
        if not self._m.is_error() and (n == 0 or self._m.rollback(n)):
            return
        m = self._initial.deep_copy()
        if self._tokens and not m.consume_tokens(self._tokens):
            raise RuntimeError(f"llguidance refused its own tokens on rebuild: {m.get_error()}")
        self._m = m

    def _native_fill(self, bitmask: torch.Tensor, row: int) -> None:
        llguidance_calls.fill_next_token_bitmask(self._m, bitmask, row)

    def _native_forced(self) -> list[TokenId]:
        return list(self._m.compute_ff_tokens())

    def _native_accepting(self) -> bool:
        return self._m.is_accepting()

    def _native_reset(self) -> None:
        self._m = self._initial.deep_copy()
        self._tokens.clear()
