"""The engine: the public facade over the actor runtime, built for a device in one place.

- engine.py   Engine: start / stop the runtime, hand requests to it, stream their deltas
- config.py   EngineConfig: every option, validated once; the device and runner it resolves to
- load.py     the models it runs: the target as its runner computes it, the draft model, and what
              the model's config alone decides, checked before any weight is read
- build.py    build_runtime: timeline, KV cache, step buffers and actors for the device; starting
              and stopping them (Runtime)
- intake.py   a request's prompt encoded and its parameters checked (one error type per fault)
- conditional.py / trie.py
              law="conditional": a request run as attempts by adaptive rejection, and the per-request
              trie of proved-dead mass its attempts learn
"""
from __future__ import annotations

from interlock.engine.build import lane_threads
from interlock.engine.config import EngineConfig
from interlock.engine.engine import Engine
from interlock.engine.intake import Prompt

__all__ = ["Engine", "EngineConfig", "Prompt", "lane_threads"]
