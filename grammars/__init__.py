"""Grammar backends (xgrammar, llguidance, and "auto": llguidance with xgrammar as fallback) behind one
matcher protocol, bitmask helpers, schema caps, and the async compile cache.

`validate_output(spec, text)`: the backend-independent end-of-request check (raises GrammarError).
grammars/keywords.py: which JSON Schema keywords each backend enforces exactly (what `auto` reads;
the table is grammars/LENIENCY.md).

Entry points: `make_backend(name, tokenizer, vocab_size, config)` (synchronous) and `GrammarLayer`
(backend + `await layer.compile(spec)` / `await layer.matcher(spec)`).
"""
from interlock.grammars.bitmask import allocate_bitmask, allowed_ids
from interlock.grammars.cache import CompileCache
from interlock.grammars.compiled import CompiledGrammar
from interlock.grammars.layer import GrammarLayer, make_backend
from interlock.grammars.matcher import BaseMatcher
from interlock.grammars.validate import validate_output

__all__ = ["BaseMatcher", "CompileCache", "CompiledGrammar", "GrammarLayer", "allocate_bitmask",
           "allowed_ids", "make_backend", "validate_output"]
