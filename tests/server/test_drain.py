"""The drain deadline after SIGTERM counts from the signal: a request that starts during the drain
(one that was queued) gets what is left of `shutdown_timeout_s`, not a timeout of its own."""
from __future__ import annotations

from interlock.engine import Engine
from interlock.server import ServerConfig
from interlock.server.app import Server

from live import PLAIN


def test_the_drain_deadline_counts_from_the_signal(tiny):
    server = Server(Engine(tiny, PLAIN), ServerConfig(model_name="tiny", shutdown_timeout_s=10.0))
    now = [100.0]
    server.clock = lambda: now[0]
    assert server.drain_left() is None                  # not shutting down
    server.begin_shutdown()
    assert server.admission.draining
    now[0] = 107.0                                      # a queued request starts 7 s into the drain
    assert server.drain_left() == 3.0
    server.begin_shutdown()                             # a second signal keeps the first deadline
    assert server.drain_left() == 3.0
    now[0] = 111.0
    assert server.drain_left() == 0.0
