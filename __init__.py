"""interlock: grammar-constrained speculative decoding for asyncio applications.

The public API, re-exported:

    Engine, EngineConfig                          the runtime (engine.py)
    SamplingParams, Delta, Completion, RequestStats
    JsonSchema, JsonObject, Regex, Ebnf, Lark, Choice, GrammarConfig
    Reasoning, StructuralTag, Tag                 grammars that switch on mid-output
    SpeculativeConfig, NGramConfig                drafters ("ngram+forced" strings work too)
    errors                                        the typed errors
    load_model, load_tokenizer                    the model layer on its own
"""
from __future__ import annotations

from interlock.engine import Engine, EngineConfig
from interlock.models.loader import LoadedModel, load_model, load_tokenizer
from interlock.protocol import errors
from interlock.protocol.grammar import (Choice, Ebnf, GrammarConfig, JsonObject, JsonSchema, Lark, Reasoning, Regex,
                                        StructuralTag, Tag)
from interlock.protocol.sampling import Completion, Delta, RequestStats, SamplingParams
from interlock.protocol.speculative import NGramConfig, SpeculativeConfig

__all__ = [
    "Choice", "Completion", "Delta", "Ebnf", "Engine", "EngineConfig", "GrammarConfig", "JsonObject",
    "JsonSchema", "Lark", "LoadedModel", "NGramConfig", "Reasoning", "Regex", "RequestStats", "SamplingParams",
    "SpeculativeConfig", "StructuralTag", "Tag", "errors", "load_model", "load_tokenizer",
]
__version__ = "0.1.0"
