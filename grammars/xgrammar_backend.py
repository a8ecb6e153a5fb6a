"""xgrammar behind the matcher protocol.

xgrammar has no validate-without-advance, so validate advances token by token and rolls back;
`max_rollback_tokens=-1` keeps unlimited history (rollback depth is ours to police).

xgrammar compiles JSON schemas it cannot enforce exactly, and says so only on stderr, if at all.
Compile captures those lines (grammars/stderr.py) and adds the keywords grammars/keywords.py knows
it drops; both become `CompiledGrammar.warnings` and structlog warnings. `auto` refuses to use such
a grammar unless the spec is lenient.

xgrammar's JSON grammar also lets raw control characters (a tab byte) into strings, which JSON
forbids. Outside strings JSON allows only tab, newline and carriage return, and only as optional
whitespace; so for JSON specs the matcher never allows a token containing a control character,
except \t \n \r under flexible whitespace (where one inside a string is still possible and is left
to the end-of-request check, grammars/validate.py). Compact JSON output is then exact.

What the backend builds from the vocabulary (`XTables`: xgrammar's TokenizerInfo, the token bytes,
the control filters) is built from the HF tokenizer once per vocabulary and kept (grammars/tables.py,
in xgrammar's own serialization); `lazy=True` builds it on first use, for `auto`, which reaches
xgrammar only when llguidance cannot compile a spec.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import numpy as np
import torch
import xgrammar as xgr

from interlock.grammars import bitmask as bm
from interlock.grammars import tables
from interlock.grammars.checks import check_spec
from interlock.grammars.compiled import CompiledGrammar
from interlock.grammars.keywords import gaps
from interlock.grammars.stderr import NATIVE_LINE, call_capturing_stderr
from interlock.grammars.matcher import BaseMatcher
from interlock.grammars.native_tags import check_native, xgrammar_structural_tag
from interlock.grammars.switch import SwitchMatcher, SwitchProgram, compile_switch, is_switch
from interlock.models.tokenizer import Tokenizer
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import (Choice, Ebnf, GrammarConfig, GrammarSpec, JsonObject, JsonSchema, Lark,
                                        Reasoning, Regex, StructuralTag)
from interlock.protocol.types import TokenId
from interlock.logs import get_logger

NAME = "xgrammar"
NOT_ENFORCED = "xgrammar does not enforce "     # prefix of the warnings that come from keywords.gaps
log = get_logger(__name__)


class XGrammarBackend:
    """Compiles specs with one xgrammar GrammarCompiler for one tokenizer and vocabulary size V."""

    name = NAME

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, config: GrammarConfig | None = None, *,
                 lazy: bool = False) -> None:
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.config = config or GrammarConfig()
        self._building = threading.Lock()        # compile threads may all ask first
        self._built: XTables | None = None
        if not lazy:
            self.tables()

    def tables(self) -> XTables:
        """What the backend builds from the vocabulary, built once. Every matcher follows a compile,
        which built it: matcher() on the event loop never builds."""
        if self._built is None:
            with self._building:
                if self._built is None:
                    self._built = XTables.build(self.tokenizer, self.vocab_size)
        return self._built

    @property
    def special_ids(self) -> frozenset[TokenId]:
        return self.tables().special_ids

    @property
    def token_bytes(self) -> tuple[bytes, ...]:
        """The bytes of each token: switching grammars match their triggers on them (grammars/triggers.py)."""
        return self.tables().token_bytes

    @property
    def _compiler(self) -> Any:
        return self.tables().compiler

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        if is_switch(spec):                      # Reasoning / StructuralTag: grammars/switch/
            if spec.native:                      # type: ignore[union-attr]
                return self._compile_native_switch(spec)  # type: ignore[arg-type]
            return compile_switch(self, self.tokenizer, spec)  # type: ignore[arg-type]
        check_spec(spec, self.config)
        start = time.perf_counter()
        try:
            native, said = call_capturing_stderr(lambda: self._compile_native(spec))
        except GrammarError:
            raise
        except Exception as exc:            # xgrammar raises RuntimeError/ValueError/its own types
            raise GrammarError(f"xgrammar: {_first_line(exc)}") from exc
        if said is None:
            said = ["its warnings could not be read (stderr held by another compile): assumed loose"]
        warnings = [f"xgrammar: {line}" for line in dict.fromkeys(said)]          # dedup, in order
        if isinstance(spec, JsonSchema):
            warnings += [NOT_ENFORCED + str(g) for g in gaps(json.loads(spec.compiled_schema), NAME)]
        for warning in warnings:
            log.warning("grammar.backend_warning", backend=NAME, warning=warning)
        # Every xgrammar warning is an approximation ("falling back to anyOf", "ignoring multipleOf").
        return CompiledGrammar(NAME, spec.key, native, time.perf_counter() - start, tuple(warnings),
                               inexact=tuple(warnings))

    def matcher(self, compiled: CompiledGrammar) -> XGrammarMatcher | SwitchMatcher:
        if compiled.backend != NAME:
            raise ValueError(f"grammar was compiled by {compiled.backend}, not {NAME}")
        if isinstance(compiled.native, SwitchProgram):
            return SwitchMatcher(compiled.native, self, self.tokenizer)
        kind, _, rest = compiled.spec_key.partition(":")
        control = None
        if kind in ("json_schema", "json_object"):
            control = self.control_filter(flexible=rest.startswith("flexible"))
        return XGrammarMatcher(compiled.native, self, control)

    def control_filter(self, *, flexible: bool) -> ControlFilter:
        """The tokens JSON output never contains (see the module docstring)."""
        return self.tables().control[flexible]

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return bm.allocate_bitmask(rows, self.vocab_size)

    def _compile_native(self, spec: GrammarSpec) -> Any:
        if isinstance(spec, JsonSchema):
            return self._json(spec.compiled_schema, spec.whitespace == "flexible")
        if isinstance(spec, JsonObject):
            return self._json(json.dumps({"type": "object"}), spec.whitespace == "flexible")
        if isinstance(spec, Regex):
            return self._compiler.compile_regex(spec.pattern)
        if isinstance(spec, Ebnf):
            return self._compiler.compile_grammar(spec.text, root_rule_name=spec.root)
        if isinstance(spec, Lark):
            return self._compiler.compile_lark(spec.text)
        if isinstance(spec, Choice):
            return self._compiler.compile_grammar(choice_ebnf(spec.options))
        raise GrammarError(f"xgrammar: unsupported spec {type(spec).__name__}")

    def _compile_native_switch(self, spec: Reasoning | StructuralTag) -> CompiledGrammar:
        """An xgrammar structural tag (grammars/native_tags.py): an ordinary grammar from here on."""
        start = time.perf_counter()
        check_native(spec, self.tokenizer, NAME)
        warnings: list[str] = []
        tag = xgrammar_structural_tag(spec, lambda inner: self._content(inner, warnings))
        try:
            native, said = call_capturing_stderr(lambda: self._compiler.compile_structural_tag(tag))
        except Exception as exc:            # xgrammar raises RuntimeError/ValueError/its own types
            raise GrammarError(f"xgrammar: {_first_line(exc)}") from exc
        warnings += [f"xgrammar: {line}" for line in dict.fromkeys(said or [])]
        return CompiledGrammar(NAME, spec.key, native, time.perf_counter() - start, tuple(warnings),
                               inexact=tuple(warnings))

    def _content(self, spec: GrammarSpec, warnings: list[str]) -> dict:
        """One constrained part of a native structural tag, as the plain spec would compile."""
        check_spec(spec, self.config)
        try:
            if isinstance(spec, (JsonSchema, JsonObject)):
                schema = spec.compiled_schema if isinstance(spec, JsonSchema) else json.dumps({"type": "object"})
                flexible = spec.whitespace == "flexible"
                if isinstance(spec, JsonSchema):
                    warnings += [NOT_ENFORCED + str(g) for g in gaps(json.loads(schema), NAME)]
                grammar = (xgr.Grammar.from_json_schema(schema, any_whitespace=True, strict_mode=False) if flexible
                           else xgr.Grammar.from_json_schema(schema, any_whitespace=False, separators=(",", ":"),
                                                             strict_mode=False))
                return {"type": "grammar", "grammar": str(grammar)}
            if isinstance(spec, Regex):
                return {"type": "regex", "pattern": spec.pattern}
            if isinstance(spec, Ebnf):
                if spec.root != "root":
                    raise GrammarError(f"xgrammar: native structural tags need the EBNF start rule 'root', "
                                       f"got {spec.root!r}")
                return {"type": "grammar", "grammar": spec.text}
            if isinstance(spec, Choice):
                return {"type": "grammar", "grammar": choice_ebnf(spec.options)}
        except GrammarError:
            raise
        except Exception as exc:
            raise GrammarError(f"xgrammar: {_first_line(exc)}") from exc
        raise GrammarError(f"xgrammar: native structural tags do not take {type(spec).__name__} parts")

    def _json(self, schema: str, flexible: bool) -> Any:
        # strict_mode=False: JSON Schema says additionalProperties defaults to true; xgrammar's
        # strict mode would refuse valid instances that carry extra keys.
        if flexible:
            return self._compiler.compile_json_schema(schema, any_whitespace=True, strict_mode=False)
        return self._compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"),
                                                  strict_mode=False)


INFO_TABLE = "xgrammar-info"


@dataclass(frozen=True)
class XTables:
    """What an XGrammarBackend builds from the vocabulary: xgrammar's TokenizerInfo and a compiler
    over it, the special ids it refuses, each token's bytes and the control filters."""

    info: Any
    compiler: Any
    special_ids: frozenset[TokenId]
    token_bytes: tuple[bytes, ...]
    control: dict[bool, ControlFilter]          # flexible? -> filter

    @classmethod
    def build(cls, tokenizer: Tokenizer, vocab_size: int) -> XTables:
        info, token_bytes = tokenizer_info(tokenizer, vocab_size)
        # xgrammar's own cache is off: CompileCache is the one cache, with one eviction policy.
        compiler = xgr.GrammarCompiler(info, max_threads=min(8, os.cpu_count() or 1), cache_enabled=False)
        return cls(info, compiler, frozenset(info.special_token_ids) - set(tokenizer.eos_token_ids), token_bytes,
                   ControlFilter.build_both(token_bytes, vocab_size))


def tokenizer_info(tokenizer: Tokenizer, vocab_size: int) -> tuple[Any, tuple[bytes, ...]]:
    """xgrammar's TokenizerInfo over V ids and the decoded bytes of each tokenizer id. The first time
    from the HF tokenizer (TokenizerInfo.from_huggingface reads the whole vocabulary: seconds at 262k
    ids, and the decoded vocabulary as much again); kept in xgrammar's own serialization beside the
    bytes, and read back from there after."""
    stops = list(tokenizer.eos_token_ids)
    parts = (version("xgrammar"), vocab_size, tuple(stops))
    kept = tables.load(tokenizer, INFO_TABLE, parts)
    if kept is not None:
        try:
            serialized, *kept_bytes = tables.unpack_bytes(kept)
            if len(kept_bytes) == tokenizer.vocab_size:
                return xgr.TokenizerInfo.deserialize_json(serialized.decode()), tuple(kept_bytes)
        except Exception:  # noqa: BLE001 - xgrammar's own errors for a serialization it refuses: built again
            pass
    info = xgr.TokenizerInfo.from_huggingface(tokenizer.hf, vocab_size=vocab_size, stop_token_ids=stops)
    token_bytes = tuple(info.decoded_vocab[: tokenizer.vocab_size])
    tables.save(tokenizer, INFO_TABLE, parts, tables.pack_bytes([info.serialize_json().encode(), *token_bytes]))
    return info, token_bytes


class ControlFilter:
    """Token ids whose text holds a control character JSON output cannot contain, and the mask
    row that keeps every other id ([ceil(V/32)] int32)."""

    def __init__(self, banned: frozenset[TokenId], keep: torch.Tensor) -> None:
        self.banned = banned
        self.keep = keep
        # the words keep changes, and their values: filtering many rows touches only these
        self.columns = (keep != -1).nonzero().flatten()
        self.keep_columns = keep[self.columns]

    @classmethod
    def build_both(cls, token_bytes: Sequence[bytes], vocab_size: int) -> dict[bool, ControlFilter]:
        """flexible? -> filter, from each token's bytes: in UTF-8 a byte below 0x20 is always that
        control character itself (every byte of a longer sequence is >= 0x80), so the bytes say what
        the decoded text would, without decoding the vocabulary again (3.8 s at Gemma 3's 262k).
        Counted over all the bytes at once: a loop over 262k tokens in Python takes a second."""
        pieces = token_bytes[:vocab_size]
        data = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        ends = np.cumsum([len(p) for p in pieces], dtype=np.int64)
        starts = ends - np.array([len(p) for p in pieces], dtype=np.int64)
        control = data < 0x20

        def holding(found: np.ndarray) -> frozenset[TokenId]:       # ids with at least one found byte
            seen = np.concatenate(([0], np.cumsum(found, dtype=np.int64)))
            return frozenset(np.flatnonzero(seen[ends] > seen[starts]).tolist())

        whitespace = np.isin(data, (0x09, 0x0A, 0x0D))
        return {flexible: cls.of(holding(control & ~whitespace if flexible else control), vocab_size)
                for flexible in (False, True)}

    @classmethod
    def of(cls, banned: frozenset[TokenId], vocab_size: int) -> ControlFilter:
        keep = bm.allocate_bitmask(1, vocab_size)
        for t in banned:
            bm.set_bit(keep, 0, t, False)
        return cls(banned, keep[0])


class XGrammarMatcher(BaseMatcher):
    def __init__(self, compiled: Any, backend: XGrammarBackend, control: ControlFilter | None = None) -> None:
        super().__init__(vocab_size=backend.vocab_size, tokenizer_vocab=backend.tokenizer.vocab_size,
                         eos_token_ids=backend.tokenizer.eos_token_ids)
        self._m = xgr.GrammarMatcher(compiled, max_rollback_tokens=-1)
        self._tokenizer = backend.tokenizer
        self._special = backend.special_ids
        self._control = control

    def _native_validate(self, token_ids: list[TokenId]) -> int:
        n = 0
        for t in self._offered(token_ids):
            if not self._m.accept_token(t):
                break
            n += 1
        if n:
            self._m.rollback(n)
        return n

    def _offered(self, token_ids: list[TokenId]) -> list[TokenId]:
        """The leading tokens worth offering to xgrammar: special ids and (for JSON) control
        characters are refused here; xgrammar would refuse specials too, but logs a warning each time."""
        banned = self._control.banned if self._control is not None else frozenset()
        for i, t in enumerate(token_ids):
            if t in self._special or t in banned:
                return token_ids[:i]
        return token_ids

    def _native_consume(self, token_ids: list[TokenId]) -> None:
        for t in token_ids:
            if not self._m.accept_token(t):      # validated just before: a refusal is a bug
                raise RuntimeError(f"xgrammar refused token {t} that it had validated")

    def _native_rollback(self, n: int) -> None:
        self._m.rollback(n)

    def _native_fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)
        if self._control is not None:
            bitmask[row] &= self._control.keep

    def _native_forced(self) -> list[TokenId]:
        # The forced string, tokenized as the model would; the last token could merge with what
        # follows, so it stays only when it is the single token the grammar allows.
        text = self._m.find_jump_forward_string()
        if not text:
            return []
        ids = self._tokenizer.encode(text)
        ids = ids[: self.validate(ids)]
        if ids and not self._only_choice_after(ids[:-1], ids[-1]):
            ids = ids[:-1]
        return ids

    def _only_choice_after(self, prefix: list[TokenId], token: TokenId) -> bool:
        mask = bm.allocate_bitmask(1, self._vocab_size)
        self.accept(prefix)
        try:
            self._fill_checked(mask, 0)
        finally:
            self.rollback(len(prefix))
        return bm.allowed_ids(mask, 0, self._vocab_size) == [token]

    def _native_accepting(self) -> bool:
        return self._m.is_completed()

    def _native_reset(self) -> None:
        self._m.reset()


def choice_ebnf(options: tuple[str, ...]) -> str:
    """root ::= "a" | "b" ...; JSON string escapes are valid GBNF literal escapes."""
    return "root ::= " + " | ".join(json.dumps(o, ensure_ascii=False) for o in options)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return NATIVE_LINE.sub("", text.splitlines()[0])[:500]
