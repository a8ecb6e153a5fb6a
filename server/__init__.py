"""The OpenAI-compatible HTTP server over one Engine (`interlock serve`).

Owns: the app factory and routes (app.py), request/response bodies (schemas.py, responses.py),
turning an OpenAI request into engine requests (translate.py, tools.py), running them and
shaping results (generation.py, shaping.py; logprobs in OpenAI's shapes: logprobs.py), SSE streaming with
disconnect = cancel (sse.py), OpenAI-shaped
errors (errors.py), bounded admission (admission.py), body-size limit and outcome counting
(middleware.py), Prometheus metrics (metrics.py), and the uvicorn process with graceful
shutdown (run.py). It uses only the Engine's public API. ray_serve.py runs N replicas of the same
app on Ray Serve (`interlock serve --replicas N`; the [cluster] extra, imported only there).
"""
from __future__ import annotations

from interlock.server.app import create_app
from interlock.server.config import ServerConfig
from interlock.server.run import build_server, serve

__all__ = ["ServerConfig", "build_server", "create_app", "serve"]
