"""Grammar specs (what a request asks for) and the two-level grammar interface (backend, matcher).

Specs are frozen and hashable; `key` is canonical (equal grammars give equal keys) and is what the
compile cache uses. The interfaces follow vLLM's backend_types and llguidance's LLMatcher: a
backend compiles specs and allocates bitmasks; a matcher is per request and stateful.
"""
from __future__ import annotations

import json
import os
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from interlock.protocol.types import TokenId

BackendName: TypeAlias = Literal["xgrammar", "llguidance", "auto"]
BACKENDS: tuple[BackendName, ...] = ("auto", "xgrammar", "llguidance")   # every name a request may give
DEFAULT_BACKEND: BackendName = "auto"
# The backends "auto" tries, in order (why: grammars/auto.py).
AUTO_ORDER: tuple[BackendName, ...] = ("llguidance", "xgrammar")
Whitespace: TypeAlias = Literal["compact", "flexible"]


def _canonical_json(value: Any) -> str:
    """Compact JSON. Key order is kept on purpose: backends emit properties in schema order."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def close_objects(schema: Any, *, close: bool = True) -> Any:
    """A copy of `schema` where objects that declare properties but say nothing of
    additionalProperties get `additionalProperties: false`.

    Branches of `allOf` are left open: closing each one would refuse the others' properties.
    """
    if isinstance(schema, list):
        return [close_objects(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: close_objects(v, close=k != "allOf") for k, v in schema.items()}
    if close and isinstance(out.get("properties"), dict) and not any(
            k in out for k in ("additionalProperties", "patternProperties", "unevaluatedProperties")):
        out["additionalProperties"] = False
    return out


@dataclass(frozen=True)
class JsonSchema:
    """Output must be JSON valid against `schema` (a dict or a JSON string).

    whitespace: "compact" allows no optional whitespace (fewer tokens, the default); "flexible"
    allows the whitespace JSON allows (pretty-printed output).
    strict: True (the default for generation) refuses keys an object does not declare unless the
    schema sets additionalProperties itself; without it a model is free to invent keys, which small
    models do. False is JSON Schema's own default (extra keys allowed), for checking instances.
    lenient: False (the default) refuses, with a GrammarError naming the keyword, a schema that no
    backend can enforce exactly (grammars/LENIENCY.md); True compiles it loosely anyway and relies
    on the end-of-request check (grammars/validate.py) to refuse an output that breaks it.
    """

    schema: str
    whitespace: Whitespace = "compact"
    strict: bool = True
    lenient: bool = False

    def __init__(self, schema: Mapping[str, Any] | str | bool, *, whitespace: Whitespace = "compact",
                 strict: bool = True, lenient: bool = False) -> None:
        if isinstance(schema, str):
            try:
                parsed = json.loads(schema)
            except json.JSONDecodeError as exc:
                from interlock.protocol.errors import GrammarError

                raise GrammarError(f"JSON schema is not valid JSON: {exc}") from exc
        else:
            parsed = schema
        object.__setattr__(self, "schema", _canonical_json(parsed))
        object.__setattr__(self, "whitespace", whitespace)
        object.__setattr__(self, "strict", strict)
        object.__setattr__(self, "lenient", bool(lenient))
        if whitespace not in ("compact", "flexible"):
            raise ValueError(f"whitespace must be 'compact' or 'flexible', got {whitespace!r}")

    @property
    def schema_dict(self) -> Any:
        return json.loads(self.schema)

    @property
    def compiled_schema(self) -> str:
        """The schema the backends compile (objects closed when strict)."""
        return _canonical_json(close_objects(self.schema_dict)) if self.strict else self.schema

    @property
    def key(self) -> str:
        mode = ("strict" if self.strict else "open") + (":lenient" if self.lenient else "")
        return f"json_schema:{self.whitespace}:{mode}:{self.schema}"


@dataclass(frozen=True)
class JsonObject:
    """Output must be one JSON object (any keys and values)."""

    whitespace: Whitespace = "compact"

    @property
    def key(self) -> str:
        return f"json_object:{self.whitespace}"


@dataclass(frozen=True)
class Regex:
    """Output must match the regular expression as a whole."""

    pattern: str

    @property
    def key(self) -> str:
        return f"regex:{self.pattern}"


@dataclass(frozen=True)
class Ebnf:
    """Output must derive from rule `root` of a GBNF/EBNF grammar (llama.cpp / xgrammar syntax)."""

    text: str
    root: str = "root"

    @property
    def key(self) -> str:
        return f"ebnf:{self.root}:{self.text}"


@dataclass(frozen=True)
class Lark:
    """Output must derive from rule `start` of a Lark grammar (llguidance's dialect)."""

    text: str

    @property
    def key(self) -> str:
        return f"lark:{self.text}"


@dataclass(frozen=True)
class Choice:
    """Output must be exactly one of `options`."""

    options: tuple[str, ...] = field(default=())

    def __init__(self, options: Sequence[str]) -> None:
        object.__setattr__(self, "options", tuple(options))

    @property
    def key(self) -> str:
        return f"choice:{_canonical_json(list(self.options))}"


PlainSpec: TypeAlias = JsonSchema | JsonObject | Regex | Ebnf | Lark | Choice


# --- grammars that switch on mid-output --------------------------------------------------------
# Markers are text. A trigger fires when the bytes of the free tokens end with it, however the
# model spelled it, and a token inside which a trigger would end is refused, so the switch falls on
# a token boundary (grammars/triggers.py); forced markers (the rest of a begin, an end) are the
# tokenizer's own token sequence for their text, which must exist (one id for a special token such
# as "<think>" where the tokenizer has it). Masks, forced tokens and rollback depend on token ids
# only and agree exactly between plain and speculative decoding. grammars/switch/ holds the
# matcher; `native=True` hands the whole spec to the backend instead (grammars/native_tags.py).

@dataclass(frozen=True)
class Reasoning:
    """Free thinking up to and including the end marker, then `then` (None: the answer is free too).

    start / end: the markers, "<think>" / "</think>" unless named (a single special token where the
    tokenizer has one, else their text's tokens); every part of interlock reads them from here.
    `start` is not required in the output (chat templates often put it in the prompt); the stream
    uses it to strip it from the thinking.
    While thinking, EOS is refused when `then` constrains the answer (an output must reach it).
    max_reasoning_tokens: after that many thinking tokens the end marker is forced (the rest of
    it, where the last tokens already begin it); None: no limit.
    native: compile with the backend's own support (grammars/native_tags.py) instead of the
    composing matcher; no max_reasoning_tokens and no special-token markers then.
    """

    then: GrammarSpec | None = None
    start: str = "<think>"
    end: str = "</think>"
    max_reasoning_tokens: int | None = None
    native: bool = False

    @property
    def key(self) -> str:
        inner = "free" if self.then is None else self.then.key
        head = [self.start, self.end, self.max_reasoning_tokens] + ([True] if self.native else [])
        return f"reasoning:{_canonical_json(head)}:{inner}"


@dataclass(frozen=True)
class Tag:
    """A tag of a StructuralTag: `begin` (starts with one of the triggers), `spec`'s grammar, `end`."""

    begin: str
    spec: GrammarSpec
    end: str

    @property
    def key(self) -> str:
        return f"tag:{_canonical_json([self.begin, self.end])}:{self.spec.key}"


@dataclass(frozen=True)
class StructuralTag:
    """Free text until the output ends with a trigger; then the rest of the tag's `begin` is forced,
    the tag's spec constrains what follows, its `end` closes it, and the text is free again.

    triggers: markers; each tag's begin starts with exactly one of them (a trigger shared by two
    tags lets the tokens after it choose). at_most: tags allowed (None: any number); after that
    many, the output must end. native: compile with the backend's own support (xgrammar structural
    tags, llguidance Lark; grammars/native_tags.py) instead of the composing matcher.
    """

    triggers: tuple[str, ...] = field(default=())
    tags: tuple[Tag, ...] = field(default=())
    at_most: int | None = None
    native: bool = False

    def __init__(self, triggers: Sequence[str], tags: Sequence[Tag], at_most: int | None = None,
                 native: bool = False) -> None:
        object.__setattr__(self, "triggers", tuple(triggers))
        object.__setattr__(self, "tags", tuple(tags))
        object.__setattr__(self, "at_most", at_most)
        object.__setattr__(self, "native", native)

    @property
    def key(self) -> str:
        tags = ",".join(t.key for t in self.tags)
        head = [list(self.triggers), self.at_most] + ([True] if self.native else [])
        return f"structural_tag:{_canonical_json(head)}:[{tags}]"


GrammarSpec: TypeAlias = PlainSpec | Reasoning | StructuralTag


def default_mask_threads() -> int:
    """Threads of a step's batched mask fills (grammars/batch.py): half the cores, at most 8.
    Measured by benchmarks/mask_bench.py (grammars/README.md): on 2 cores xgrammar's batch fill is
    slower at 2-8 threads than at 1 and llguidance gains nothing; issue 32 measured a 16-core host's
    xgrammar batch fill fastest at 4-8 threads and slower at 16."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


@dataclass(frozen=True)
class GrammarConfig:
    """Limits and policy of the grammar layer (one per engine).

    mask_threads: native threads of the step's batched mask fills (default: default_mask_threads()).
    batched_masks: a step's check, mask rows and commit as one batch pass per backend
    (grammars/batch.py); False: request by request, the reference path (the same masks). None:
    batched on the device runner (CUDA), where the grammar lane's host work is the step at large
    batches, and request by request on the CPU engine, whose grammar lane is hidden under its
    slower forward: there the batched pass measured 0.92-0.98x at concurrency 8 and 0.98x at 32
    (docs/performance.md; llguidance's batched check fills masks before the forward starts).
    """

    backend: BackendName = DEFAULT_BACKEND
    compile_timeout_s: float = 10.0
    cache_max_entries: int = 256
    max_schema_bytes: int = 256 * 1024
    max_schema_depth: int = 64
    mask_threads: int = field(default_factory=default_mask_threads)
    batched_masks: bool | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {self.backend!r}")
        for name in ("compile_timeout_s", "cache_max_entries"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if not isinstance(self.mask_threads, int) or isinstance(self.mask_threads, bool) or self.mask_threads < 1:
            raise ValueError(f"mask_threads must be a positive int, got {self.mask_threads!r}")
        if self.batched_masks not in (None, True, False):
            raise ValueError(f"batched_masks must be None, True or False, got {self.batched_masks!r}")


# --- the two-level interface ---------------------------------------------------------------------

@runtime_checkable
class GrammarMatcher(Protocol):
    """Per-request grammar state. A refused token is state (False / a short prefix), not an exception.

    Bitmasks are int32 tensors [rows, ceil(V/32)], bit j of word i set = token 32*i+j allowed.
    """

    def accept(self, token_ids: Sequence[TokenId]) -> bool:
        """Advance by all tokens, or by none and return False (state unchanged)."""
        ...

    def validate(self, token_ids: Sequence[TokenId]) -> int:
        """Length of the longest prefix of token_ids the grammar allows from here; state unchanged."""
        ...

    def rollback(self, n: int) -> None:
        """Undo the last n accepted tokens. Raises ValueError if n exceeds the accepted history."""
        ...

    def fill_mask(self, bitmask: Any, row: int = 0) -> bool:
        """Write the allowed-token bits of the current state into bitmask[row].

        Returns True when the state is free (every tokenizer id allowed: a switching grammar
        outside its constrained part); the row is written all the same.
        """
        ...

    def fill_masks(self, bitmask: Any, start_row: int, drafts: Sequence[TokenId],
                   skip: Container[int] = (), free: Any = None) -> int:
        """Fill rows start_row.. for the current state and after each draft prefix, in one call.

        Row start_row + j is the mask after drafts[:j]. Stops early at the first draft the grammar
        refuses; returns the number of rows valid (1 + accepted drafts). State is unchanged.
        Offsets j in `skip` are left alone: their rows already hold that mask.

        free: None, or a writable 1-D bool buffer indexed like the bitmask's rows (a CPU tensor or
        a list). For each valid row not in skip, free[row] becomes True when the state there is
        free, and that row is then NOT written (it is stale: the verifier must skip it, which is
        cheaper and exact, since a free row would allow everything); False when the row was
        filled. Without the buffer every row is written, free ones as all tokenizer ids.
        """
        ...

    def forced_tokens(self) -> list[TokenId]:
        """Tokens the grammar forces from here (jump-forward); empty when there is a choice."""
        ...

    def is_accepting(self) -> bool:
        """True when the output so far is a complete sentence of the grammar (EOS allowed)."""
        ...

    def is_terminated(self) -> bool:
        """True after EOS was accepted (or the grammar can produce nothing more)."""
        ...

    def reset(self) -> None:
        ...

    @property
    def num_accepted(self) -> int:
        """Tokens accepted and not rolled back (the depth rollback can reach)."""
        ...


@runtime_checkable
class GrammarBackend(Protocol):
    """Compiles specs for one tokenizer and vocabulary size; hands out matchers."""

    name: str
    vocab_size: int

    def compile(self, spec: GrammarSpec) -> Any:
        """Compile (blocking; callers run it in a worker thread). Raises GrammarError."""
        ...

    def matcher(self, compiled: Any) -> GrammarMatcher:
        ...

    def allocate_bitmask(self, rows: int) -> Any:
        """An int32 tensor [rows, ceil(vocab_size/32)] with every bit set."""
        ...
