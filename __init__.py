"""interlock: grammar-constrained speculative decoding for asyncio applications.

The public API is re-exported here; everything else is an implementation detail.
"""
from __future__ import annotations

from interlock.models.loader import LoadedModel, load_model, load_tokenizer
from interlock.protocol import errors

__all__ = ["LoadedModel", "errors", "load_model", "load_tokenizer"]
__version__ = "0.1.0"
