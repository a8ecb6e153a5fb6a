"""ServerConfig: what one server process is started with (validated here, never mutated)."""
from __future__ import annotations

from dataclasses import dataclass

from interlock.models.names import EMBEDDED


@dataclass(frozen=True)
class ServerConfig:
    """Limits and identity of the HTTP layer; the engine has its own EngineConfig.

    max_queue: engine requests admitted beyond the engine's batch (a request with n choices takes
    n); past it the server answers 429 with Retry-After instead of letting memory grow.
    """

    model_name: str = EMBEDDED  # the id clients pass as `model` and /v1/models lists
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_queue: int = 64
    max_body_bytes: int = 1 << 20
    max_n: int = 16
    default_max_tokens: int = 256
    retry_after_s: int = 1
    shutdown_timeout_s: float = 10.0
    health_timeout_s: float = 2.0
    # Chat outputs think first: every chat grammar G becomes Reasoning(then=G) (free thinking up to
    # </think>, then G), and the thinking is returned as message.reasoning_content.
    reasoning: bool = False
    # uvicorn's access log, one line per HTTP request at info on the "uvicorn.access" logger (on
    # whatever the process's log level; off by default: a busy server's lines are its operator's call).
    access_log: bool = False

    def __post_init__(self) -> None:
        for name, least in (("max_queue", 0), ("max_body_bytes", 1), ("max_n", 1), ("default_max_tokens", 1)):
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be >= {least}, got {getattr(self, name)!r}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
