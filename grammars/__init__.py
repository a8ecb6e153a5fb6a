"""Grammar backends (xgrammar, llguidance, and "auto": llguidance with xgrammar as fallback) behind one
matcher protocol, switching grammars (switch/), bitmask helpers, schema caps, and the compiled-grammar
store (compile_cache.py: keys, LRU, counts). Synchronous only: the thin async compile front
(GrammarLayer and its CompileCache: worker threads, timeouts, one compile per key) is
actors/grammar_layer.py and actors/compile_cache.py.

`validate_output(spec, text)`: the backend-independent end-of-request check (raises GrammarError).
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
from interlock.grammars.backends import BackendRouter, make_backend
from interlock.grammars.bitmask import allocate_bitmask, allowed_ids
from interlock.grammars.compiled import CompiledGrammar
from interlock.grammars.matcher import BaseMatcher
from interlock.grammars.validate import validate_output

__all__ = ["BackendRouter", "BaseMatcher", "CompiledGrammar", "allocate_bitmask", "allowed_ids", "make_backend",
           "validate_output"]
