"""interlock: grammar-constrained speculative decoding for asyncio applications.

The public API, re-exported:

    Engine, EngineConfig                          the runtime (engine.py)
    SamplingParams, Delta, Completion, RequestStats, TokenLogprob
    JsonSchema, JsonObject, Regex, Ebnf, Lark, Choice, GrammarConfig
    Reasoning, StructuralTag, Tag                 grammars that switch on mid-output
    SpeculativeConfig, NGramConfig                drafters ("ngram+forced" strings work too)
    errors                                        the typed errors
    load_model, load_tokenizer                    the model layer on its own
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Names are imported on first use (PEP 562), so `import interlock.models...` in a tensor-parallel
# worker or a tool does not pay for the engine, the grammar backends and torch._dynamo (seconds).
_EXPORTS = {
    "Engine": "interlock.engine", "EngineConfig": "interlock.engine",
    "LoadedModel": "interlock.models.loader", "load_model": "interlock.models.loader",
    "load_tokenizer": "interlock.models.loader",
    "Choice": "interlock.protocol.grammar", "Ebnf": "interlock.protocol.grammar",
    "GrammarConfig": "interlock.protocol.grammar", "JsonObject": "interlock.protocol.grammar",
    "JsonSchema": "interlock.protocol.grammar", "Lark": "interlock.protocol.grammar",
    "Regex": "interlock.protocol.grammar", "Reasoning": "interlock.protocol.grammar",
    "StructuralTag": "interlock.protocol.grammar", "Tag": "interlock.protocol.grammar",
    "Completion": "interlock.protocol.sampling", "Delta": "interlock.protocol.sampling",
    "RequestStats": "interlock.protocol.sampling", "SamplingParams": "interlock.protocol.sampling",
    "TokenLogprob": "interlock.protocol.sampling",
    "NGramConfig": "interlock.protocol.speculative", "SpeculativeConfig": "interlock.protocol.speculative",
}

if TYPE_CHECKING:
    from interlock.engine import Engine, EngineConfig
    from interlock.models.loader import LoadedModel, load_model, load_tokenizer
    from interlock.protocol import errors
    from interlock.protocol.grammar import (Choice, Ebnf, GrammarConfig, JsonObject, JsonSchema, Lark, Reasoning,
                                            Regex, StructuralTag, Tag)
    from interlock.protocol.sampling import Completion, Delta, RequestStats, SamplingParams, TokenLogprob
    from interlock.protocol.speculative import NGramConfig, SpeculativeConfig


def __getattr__(name: str) -> Any:
    if name == "errors":
        return importlib.import_module("interlock.protocol.errors")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'interlock' has no attribute {name!r}")


__all__ = [
    "Choice", "Completion", "Delta", "Ebnf", "Engine", "EngineConfig", "GrammarConfig", "JsonObject",
    "JsonSchema", "Lark", "LoadedModel", "NGramConfig", "Reasoning", "Regex", "RequestStats", "SamplingParams",
    "SpeculativeConfig", "StructuralTag", "Tag", "TokenLogprob", "errors", "load_model", "load_tokenizer",
]
__version__ = "0.1.0"
