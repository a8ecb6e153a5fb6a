"""LiveServer: a real interlock server (uvicorn, real sockets) in a background thread."""
from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

import httpx
import openai
from resources import leaks

from interlock.engine import Engine, EngineConfig
from interlock.models.loader import LoadedModel
from interlock.protocol.speculative import SpeculativeConfig
from interlock.server import ServerConfig, build_server

T = TypeVar("T")

# The two engines most server tests run behind (conftest.py's `server` and `plain` fixtures).
SPEC = EngineConfig(speculative=SpeculativeConfig(("ngram", "forced"), max_draft_len=3), max_batch_size=8)
PLAIN = EngineConfig(speculative=None, max_batch_size=8)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """`with LiveServer(model, EngineConfig(...), ServerConfig(...)) as srv:` serves on srv.url."""

    def __init__(self, loaded: LoadedModel, engine_config: EngineConfig = EngineConfig(),
                 config: ServerConfig | None = None) -> None:
        self.engine = Engine(loaded, engine_config)
        config = config or ServerConfig(model_name=loaded.name)
        self.config = replace(config, host="127.0.0.1", port=free_port())
        self.uv = build_server(self.engine, self.config)
        self.app_server = self.uv.app_server
        self.thread = threading.Thread(target=self.uv.run, name="live-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config.port}"

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.uv.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.uv.should_exit = True
        self.thread.join(60)

    def call(self, fn: Callable[[], Awaitable[T]], timeout: float = 30) -> T:
        """Run an engine coroutine on the server's loop (the engine belongs to it)."""
        assert self.app_server.loop is not None
        return asyncio.run_coroutine_threadsafe(fn(), self.app_server.loop).result(timeout)  # type: ignore[arg-type]

    def resources(self) -> dict[str, int]:
        return self.call(self.engine.resources)

    def client(self, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw)

    def async_client(self, **kw: Any) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw)

    def metric(self, name: str, labels: str = "") -> float:
        """One sample of /metrics, e.g. metric("interlock_requests_total", 'endpoint="chat",outcome="ok"')."""
        text = httpx.get(self.url + "/metrics").text
        key = f"{name}{{{labels}}}" if labels else name
        for line in text.splitlines():
            if line.startswith(key + " "):
                return float(line.split()[-1])
        raise KeyError(key)

    def wait_idle(self, timeout: float = 10) -> dict[str, int]:
        """Cancels are processed between engine steps, and each actor frees its part from its own
        inbox: poll until everything is free (or the timeout), and return the last reading."""
        deadline = time.monotonic() + timeout
        while True:
            res = self.resources()
            if all_free(res, self.engine.config.max_batch_size) or time.monotonic() > deadline:
                return res
            time.sleep(0.01)


def eventually(predicate: Callable[[], bool], timeout: float = 5) -> bool:
    """Poll `predicate` until it holds or `timeout` passes; its last value."""
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def all_free(res: dict[str, int], max_batch_size: int) -> bool:
    return not leaks(res, max_batch_size)


def assert_all_free(res: dict[str, int], max_batch_size: int) -> None:
    assert not leaks(res, max_batch_size), res
