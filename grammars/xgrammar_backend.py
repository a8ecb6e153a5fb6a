"""xgrammar behind the matcher protocol.

xgrammar has no validate-without-advance, so validate advances token by token and rolls back;
`max_rollback_tokens=-1` keeps unlimited history (rollback depth is ours to police).
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

import torch
import xgrammar as xgr

from interlock.grammars import bitmask as bm
from interlock.grammars.checks import check_spec
from interlock.grammars.compiled import CompiledGrammar
from interlock.grammars.matcher import BaseMatcher
from interlock.grammars.switch import SwitchMatcher, SwitchProgram, compile_switch, is_switch
from interlock.models.tokenizer import Tokenizer
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import Choice, Ebnf, GrammarConfig, GrammarSpec, JsonObject, JsonSchema, Lark, Regex
from interlock.protocol.types import TokenId

NAME = "xgrammar"


class XGrammarBackend:
    """Compiles specs with one xgrammar GrammarCompiler for one tokenizer and vocabulary size V."""

    name = NAME

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, config: GrammarConfig | None = None) -> None:
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.config = config or GrammarConfig()
        self._info = xgr.TokenizerInfo.from_huggingface(
            tokenizer.hf, vocab_size=vocab_size, stop_token_ids=list(tokenizer.eos_token_ids))
        # xgrammar's own cache is off: CompileCache is the one cache, with one eviction policy.
        self.special_ids = frozenset(self._info.special_token_ids) - set(tokenizer.eos_token_ids)
        self._compiler = xgr.GrammarCompiler(self._info, max_threads=min(8, os.cpu_count() or 1),
                                             cache_enabled=False)

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        if is_switch(spec):                      # Reasoning / StructuralTag: grammars/switch.py
            return compile_switch(self, self.tokenizer, spec)  # type: ignore[arg-type]
        check_spec(spec, self.config)
        start = time.perf_counter()
        try:
            native = self._compile_native(spec)
        except GrammarError:
            raise
        except Exception as exc:            # xgrammar raises RuntimeError/ValueError/its own types
            raise GrammarError(f"xgrammar: {_first_line(exc)}") from exc
        return CompiledGrammar(NAME, spec.key, native, time.perf_counter() - start)

    def matcher(self, compiled: CompiledGrammar) -> XGrammarMatcher | SwitchMatcher:
        if compiled.backend != NAME:
            raise ValueError(f"grammar was compiled by {compiled.backend}, not {NAME}")
        if isinstance(compiled.native, SwitchProgram):
            return SwitchMatcher(compiled.native, self, self.tokenizer)
        return XGrammarMatcher(compiled.native, self)

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

    def _json(self, schema: str, flexible: bool) -> Any:
        # strict_mode=False: JSON Schema says additionalProperties defaults to true; xgrammar's
        # strict mode would refuse valid instances that carry extra keys.
        if flexible:
            return self._compiler.compile_json_schema(schema, any_whitespace=True, strict_mode=False)
        return self._compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"),
                                                  strict_mode=False)


class XGrammarMatcher(BaseMatcher):
    def __init__(self, compiled: Any, backend: XGrammarBackend) -> None:
        super().__init__(vocab_size=backend.vocab_size, tokenizer_vocab=backend.tokenizer.vocab_size,
                         eos_token_ids=backend.tokenizer.eos_token_ids)
        self._m = xgr.GrammarMatcher(compiled, max_rollback_tokens=-1)
        self._tokenizer = backend.tokenizer
        self._special = backend.special_ids

    def _native_validate(self, token_ids: list[TokenId]) -> int:
        n = 0
        for t in token_ids:
            # Special ids are refused here: xgrammar would refuse them too, but logs a warning each time.
            if t in self._special or not self._m.accept_token(t):
                break
            n += 1
        if n:
            self._m.rollback(n)
        return n

    def _native_consume(self, token_ids: list[TokenId]) -> None:
        for t in token_ids:
            if not self._m.accept_token(t):      # validated just before: a refusal is a bug
                raise RuntimeError(f"xgrammar refused token {t} that it had validated")

    def _native_rollback(self, n: int) -> None:
        self._m.rollback(n)

    def _native_fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)

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
    return text.splitlines()[0][:500]
