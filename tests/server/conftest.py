"""Server fixtures: a real uvicorn server on 127.0.0.1 (a free port) in a thread, one per module
and configuration; tests talk to it over HTTP with the official `openai` client or httpx, and
reach into its engine (public API only) on the server's own event loop."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server needs the [serve] extra")
pytest.importorskip("openai", reason="the server tests need the [dev] extra")

sys.path.insert(0, str(Path(__file__).parent))     # for `import live` (importlib import mode)

from live import PLAIN, SPEC, LiveServer


@pytest.fixture(scope="module")
def server(tiny):
    """A server per module over the tiny preset with n-gram + forced drafts (live.SPEC)."""
    with LiveServer(tiny, SPEC) as srv:
        yield srv


@pytest.fixture(scope="module")
def plain(tiny):
    """A server per module over the tiny preset without speculation (live.PLAIN)."""
    with LiveServer(tiny, PLAIN) as srv:
        yield srv
