"""Running the app: uvicorn in this process, with a graceful shutdown on SIGTERM / SIGINT.

On the first signal the server stops accepting connections and admissions, lets requests in
flight finish for `shutdown_timeout_s`, then ends the rest cleanly (a 503, or an error event and
`[DONE]` in a stream), closes the engine and returns; the process exits 0. A second SIGINT
forces the exit.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import math
import signal
import threading
from collections.abc import Callable, Generator

import uvicorn

from interlock.engine import Engine
from interlock.server.app import Server, create_app
from interlock.server.config import ServerConfig

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulServer(uvicorn.Server):
    """uvicorn's Server that tells the app when shutdown begins (so it can drain on its own
    deadline, before uvicorn would cancel tasks) and does not re-raise the signal afterwards (so
    a SIGTERM'd server exits 0 instead of dying of the signal)."""

    def __init__(self, config: uvicorn.Config, app_server: Server, on_ready: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.app_server = app_server
        self.on_ready = on_ready

    async def startup(self, sockets: list | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_ready is not None:      # the engine is up and the socket listens
            self.on_ready()

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


def build_server(engine: Engine, config: ServerConfig, log_level: str = "warning",
                 on_ready: Callable[[], None] | None = None) -> GracefulServer:
    """uvicorn over the app; `on_ready` runs once the engine has started and the socket listens."""
    app = create_app(engine, config)
    # uvicorn's own logging set-up, with its access lines on stderr beside every other log line:
    # stdout is for results, and a server has none to print.
    log_config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    log_config["handlers"]["access"]["stream"] = "ext://sys.stderr"
    uv = uvicorn.Config(app, host=config.host, port=config.port, lifespan="on", access_log=config.access_log,
                        log_level=log_level, log_config=log_config,
                        timeout_graceful_shutdown=math.ceil(config.shutdown_timeout_s + 5.0))
    if config.access_log:       # uvicorn set its loggers to log_level; access lines are info, asked for here
        level = logging.getLevelNamesMapping().get(log_level.upper(), logging.WARNING)
        logging.getLogger("uvicorn.access").setLevel(min(logging.INFO, level))
    return GracefulServer(uv, app.state.server, on_ready)


async def serve(engine: Engine, config: ServerConfig, log_level: str = "warning",
                on_ready: Callable[[], None] | None = None) -> None:
    """Serve until a signal arrives (or the server is told to exit), then shut down gracefully."""
    await build_server(engine, config, log_level, on_ready).serve()
