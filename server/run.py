"""Running the app: uvicorn in this process, with a graceful shutdown on SIGTERM / SIGINT.

On the first signal the server stops accepting connections and admissions, lets requests in
flight finish for `shutdown_timeout_s`, then ends the rest cleanly (a 503, or an error event and
`[DONE]` in a stream), closes the engine and returns; the process exits 0. A second SIGINT
forces the exit.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Generator

import uvicorn

from interlock.engine import Engine
from interlock.server.app import Server, create_app
from interlock.server.config import ServerConfig

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulServer(uvicorn.Server):
    """uvicorn's Server that tells the app when shutdown begins (so it can drain on its own
    deadline, before uvicorn would cancel tasks) and does not re-raise the signal afterwards (so
    a SIGTERM'd server exits 0 instead of dying of the signal)."""

    def __init__(self, config: uvicorn.Config, app_server: Server) -> None:
        super().__init__(config)
        self.app_server = app_server

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    async def shutdown(self, sockets: list | None = None) -> None:
        self.app_server.begin_shutdown()
        await super().shutdown(sockets)


def build_server(engine: Engine, config: ServerConfig, log_level: str = "warning") -> GracefulServer:
    app = create_app(engine, config)
    uv = uvicorn.Config(app, host=config.host, port=config.port, lifespan="on", access_log=False,
                        log_level=log_level, timeout_graceful_shutdown=config.shutdown_timeout_s + 5.0)
    return GracefulServer(uv, app.state.server)


async def serve(engine: Engine, config: ServerConfig, log_level: str = "warning") -> None:
    """Serve until a signal arrives (or the server is told to exit), then shut down gracefully."""
    await build_server(engine, config, log_level).serve()
