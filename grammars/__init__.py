"""Grammar backends (xgrammar, llguidance, and "auto": llguidance with xgrammar as fallback) behind one
matcher protocol, switching grammars (switch/), bitmask helpers, schema caps, and the compiled-grammar
store (compiled_store.py: keys, LRU, counts). Synchronous only: the thin async compile front
(GrammarLayer and its CompileCache: worker threads, timeouts, one compile per key) is
actors/grammar_layer.py and actors/compile_cache.py.

`validate_output(spec, text)`: the backend-independent end-of-request check (raises GrammarError).
precheck.py: what can be told of a grammar without a tokenizer (the CLI's check, before torch is
imported), from llguidance's verdict on its text (llguidance_text.py, which the backend compiles too).
grammars/keywords.py: which JSON Schema keywords each backend enforces exactly (what `auto` reads;
the table is grammars/LENIENCY.md).
Grammars that switch mid-output (Reasoning, StructuralTag): grammars/switch/ (the composing
matcher), grammars/triggers.py (byte-level trigger matching), grammars/native_tags.py (`native=True`:
the backends' own structural tags / Lark).

A step's grammar work for the whole batch (draft check, K+1 mask rows, commit), one batch call
per backend and draft position: batch.py (`StepMasks`), with batch_xgrammar.py and
batch_llguidance.py, which share batch_parts.py (a request's part, a backend's batch interface);
bit-identical to the matchers' per-row path.

Entry points: `make_backend(name, tokenizer, vocab_size, config)` and `BackendRouter` (a matcher
for a compiled grammar of whichever backend compiled it), in backends.py.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Names are imported on first use (PEP 562): the backends import xgrammar and torch (seconds), and
# the checks a CLI runs on a grammar before loading anything (checks.py, validate.py, precheck.py) need neither.
_EXPORTS = {
    "BackendRouter": "interlock.grammars.backends", "make_backend": "interlock.grammars.backends",
    "allocate_bitmask": "interlock.grammars.bitmask", "allowed_ids": "interlock.grammars.bitmask",
    "CompiledGrammar": "interlock.grammars.compiled", "BaseMatcher": "interlock.grammars.matcher",
    "validate_output": "interlock.grammars.validate",
}

if TYPE_CHECKING:
    from interlock.grammars.backends import BackendRouter, make_backend
    from interlock.grammars.bitmask import allocate_bitmask, allowed_ids
    from interlock.grammars.compiled import CompiledGrammar
    from interlock.grammars.matcher import BaseMatcher
    from interlock.grammars.validate import validate_output


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'interlock.grammars' has no attribute {name!r}")


__all__ = ["BackendRouter", "BaseMatcher", "CompiledGrammar", "allocate_bitmask", "allowed_ids", "make_backend",
           "validate_output"]
