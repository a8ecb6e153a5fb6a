"""The engine: the public facade over the actor runtime, built for a device in one place.

- engine.py   Engine: start / stop the runtime, hand requests to it, stream their deltas
- config.py   EngineConfig: every option, validated once; the device and runner it resolves to
- build.py    build_runtime: timeline, target forward, KV cache and step buffers for the device
- intake.py   a request's prompt encoded and its parameters checked (one error type per fault)
"""
from __future__ import annotations

from interlock.engine.build import lane_threads
from interlock.engine.config import EngineConfig
from interlock.engine.engine import Engine
from interlock.engine.intake import Prompt

__all__ = ["Engine", "EngineConfig", "Prompt", "lane_threads"]
