"""Compiling a switching spec (`Reasoning`, `StructuralTag`) for one backend into a `SwitchProgram`:
markers resolved to the tokenizer's own token sequences, inner specs compiled with the backend's
native grammar, the triggers' byte-level scan built (grammars/triggers.py). Raises GrammarError for
a spec that cannot switch unambiguously."""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from interlock.grammars.compiled import CompiledGrammar
from interlock.grammars.triggers import TriggerScan, build_scan
from interlock.models.tokenizer import Tokenizer
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import GrammarBackend, GrammarSpec, Reasoning, StructuralTag
from interlock.protocol.types import TokenId

@dataclass(frozen=True)
class CompiledTag:
    """One tag as token ids: begin = trigger + the rest of begin; end None runs to EOS."""

    trigger: tuple[TokenId, ...]
    begin: tuple[TokenId, ...]
    inner: CompiledGrammar | None            # None: free (Reasoning with then=None)
    end: tuple[TokenId, ...] | None
    spec: GrammarSpec | None = None          # what inner was compiled from (the end-of-output check)


@dataclass(frozen=True)
class SwitchProgram:
    """What compiling a switching spec yields (CompiledGrammar.native); shared by requests."""

    triggers: tuple[tuple[TokenId, ...], ...]
    tags: tuple[CompiledTag, ...]
    at_most: int | None
    free_eos: bool                           # may the output end in free text?
    budget: int | None = None                # free tokens before the (single) trigger is forced
    reasoning: tuple[tuple[TokenId, ...], tuple[TokenId, ...]] | None = None  # (start, end) ids
    scan: TriggerScan | None = field(default=None, compare=False)  # the triggers byte-level (compile sets it)


def is_switch(spec: Any) -> bool:
    return isinstance(spec, (Reasoning, StructuralTag))


def marker_ids(tokenizer: Tokenizer, text: str, what: str) -> tuple[TokenId, ...]:
    """The tokenizer's token sequence for marker `text`. Raises GrammarError when there is none
    that decodes back to exactly that text, or when it holds EOS."""
    if not isinstance(text, str) or not text:
        raise GrammarError(f"{what}: a marker must be a non-empty string, got {text!r}")
    ids = tuple(tokenizer.encode(text))
    back = tokenizer.decode(list(ids)) if ids else ""
    if not ids or back != text:
        raise GrammarError(f"{what}: marker {text!r} is not a token sequence of this tokenizer "
                           f"(it encodes to {list(ids)}, which decodes to {back!r})")
    eos = set(tokenizer.eos_token_ids)
    if eos & set(ids):
        raise GrammarError(f"{what}: marker {text!r} contains the end-of-sequence token")
    return ids


def compile_switch(backend: GrammarBackend, tokenizer: Tokenizer, spec: Reasoning | StructuralTag) -> CompiledGrammar:
    """Resolve markers and compile the inner specs with `backend`. Raises GrammarError."""
    start = time.perf_counter()
    if isinstance(spec, Reasoning):
        program, warnings = _reasoning(backend, tokenizer, spec)
    elif isinstance(spec, StructuralTag):
        program, warnings = _structural(backend, tokenizer, spec, inside=None)
    else:
        raise GrammarError(f"not a switching grammar: {type(spec).__name__}")
    program = replace(program, scan=_scan(backend, tokenizer, program, spec))
    inexact = tuple(w for tag in program.tags if tag.inner is not None for w in tag.inner.inexact)
    return CompiledGrammar(backend.name, spec.key, program, time.perf_counter() - start, warnings, inexact)


def _reasoning(backend: GrammarBackend, tokenizer: Tokenizer, spec: Reasoning) -> tuple[SwitchProgram, tuple[str, ...]]:
    start = marker_ids(tokenizer, spec.start, "Reasoning.start")
    end = marker_ids(tokenizer, spec.end, "Reasoning.end")
    if _contains(start, end) or _contains(end, start):
        raise GrammarError("Reasoning: the start and end markers overlap (one holds the other)")
    inner: CompiledGrammar | None = None
    warnings: tuple[str, ...] = ()
    if spec.then is not None:
        if isinstance(spec.then, Reasoning):
            raise GrammarError("Reasoning.then: a Reasoning cannot be nested in another")
        inner = _compile_inner(backend, tokenizer, spec.then, "Reasoning.then")
        warnings = inner.warnings
    budget = spec.max_reasoning_tokens
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 0):
        raise GrammarError(f"Reasoning.max_reasoning_tokens must be a non-negative int or None, got {budget!r}")
    tag = CompiledTag(trigger=end, begin=end, inner=inner, end=None, spec=spec.then)
    return SwitchProgram((end,), (tag,), 1, free_eos=inner is None and budget is None, reasoning=(start, end),
                         budget=budget), warnings


def _structural(backend: GrammarBackend, tokenizer: Tokenizer, spec: StructuralTag,
                inside: str | None) -> tuple[SwitchProgram, tuple[str, ...]]:
    if not spec.triggers or not spec.tags:
        raise GrammarError("StructuralTag: needs at least one trigger and one tag")
    if spec.at_most is not None and (not isinstance(spec.at_most, int) or spec.at_most < 1):
        raise GrammarError(f"StructuralTag.at_most must be a positive int or None, got {spec.at_most!r}")
    texts = list(spec.triggers)
    triggers = [marker_ids(tokenizer, t, f"StructuralTag trigger {t!r}") for t in texts]
    for i, a in enumerate(texts):
        for j, b in enumerate(texts):
            if i != j and (a in b or _contains(triggers[j], triggers[i])):
                raise GrammarError(f"StructuralTag: triggers {a!r} and {b!r} overlap (one holds the other); "
                                   "the switch would be ambiguous")
    tags: list[CompiledTag] = []
    warnings: list[str] = []
    used: set[int] = set()
    for n, tag in enumerate(spec.tags):
        what = f"StructuralTag tag {n} ({tag.begin!r})"
        hits = [i for i, t in enumerate(texts) if tag.begin.startswith(t)]
        if len(hits) != 1:
            raise GrammarError(f"{what}: begin must start with exactly one trigger of {texts}")
        i = hits[0]
        used.add(i)
        rest = tag.begin[len(texts[i]):]
        begin = triggers[i] + (marker_ids(tokenizer, rest, f"{what} begin") if rest else ())
        end = marker_ids(tokenizer, tag.end, f"{what} end")
        if is_switch(tag.spec):
            raise GrammarError(f"{what}: a tag's spec cannot itself switch (nested Reasoning or StructuralTag)")
        inner = _compile_inner(backend, tokenizer, tag.spec, what)
        warnings.extend(inner.warnings)
        tags.append(CompiledTag(triggers[i], begin, inner, end, tag.spec))
    for i in range(len(tags)):
        for j in range(len(tags)):
            if i != j and tags[j].begin[:len(tags[i].begin)] == tags[i].begin:
                raise GrammarError(f"StructuralTag: the begin of tag {i} is a prefix of tag {j}'s; "
                                   "after it the grammar could not tell them apart")
    unused = [texts[i] for i in range(len(texts)) if i not in used]
    if unused:
        raise GrammarError(f"StructuralTag: triggers {unused} start no tag")
    return SwitchProgram(tuple(triggers), tuple(tags), spec.at_most, free_eos=True), tuple(warnings)


def token_bytes(backend: GrammarBackend, tokenizer: Tokenizer) -> tuple[bytes, ...]:
    """The bytes of each tokenizer id, as the backend's own tokenizer view has them."""
    held = getattr(backend, "token_bytes", None)
    if held is None:
        raise GrammarError(f"backend {backend.name!r} cannot say its tokens' bytes: switching grammars need them")
    return tuple(held)[: tokenizer.vocab_size]


def _scan(backend: GrammarBackend, tokenizer: Tokenizer, program: SwitchProgram,
          spec: Reasoning | StructuralTag) -> TriggerScan:
    texts = [spec.end] if isinstance(spec, Reasoning) else list(spec.triggers)
    scan = build_scan([t.encode() for t in texts], program.triggers, token_bytes(backend, tokenizer), tokenizer,
                      backend.vocab_size)
    missing = [tail for tail in scan.rows if not scan.continuation(tail, 0)]
    if program.budget is not None and missing:
        raise GrammarError(f"Reasoning: the end marker {texts[0]!r} cannot be forced after free text ending in "
                           f"{missing[0]!r} (max_reasoning_tokens needs it)")
    return scan


def _compile_inner(backend: GrammarBackend, tokenizer: Tokenizer, spec: GrammarSpec, what: str) -> CompiledGrammar:
    try:
        return backend.compile(spec)
    except GrammarError as exc:
        raise GrammarError(f"{what}: {exc}") from exc


def _contains(hay: tuple[TokenId, ...], needle: tuple[TokenId, ...]) -> bool:
    n = len(needle)
    return any(hay[i:i + n] == needle for i in range(len(hay) - n + 1))

