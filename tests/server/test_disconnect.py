"""A client that goes away cancels its engine request at once: slot, KV blocks, matcher and draft
state are free again within a second (the issue's bound; a cancel takes one engine step), and the
request did not run on to its max_tokens."""
from __future__ import annotations

import httpx
import pytest

from interlock.engine import EngineConfig
from interlock.protocol.speculative import SpeculativeConfig
from live import LiveServer, assert_all_free, eventually

CONFIG = EngineConfig(speculative=SpeculativeConfig(("ngram", "forced"), max_draft_len=3), max_batch_size=2)
# 4000 tokens of digits: the grammar refuses to stop sooner, so only a cancel ends it early
LONG = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000,
        "structured_outputs": {"regex": "[0-9]{2000,}"}}
CANCELLED = 'endpoint="chat",outcome="cancelled"'


@pytest.fixture(scope="module")
def server(tiny):
    with LiveServer(tiny, CONFIG) as srv:
        yield srv


def engine_tokens(srv: LiveServer) -> int:
    return srv.call(srv.engine.metrics).output_tokens


def test_disconnect_mid_stream_frees_everything(server):
    before, cancelled = engine_tokens(server), server.metric("interlock_requests_total", CANCELLED)
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**LONG, "stream": True}, timeout=30) as r:
        lines = r.iter_lines()
        got = [line for line, _ in zip(lines, range(6)) if line.startswith("data:")]
        assert len(got) == 3 and r.status_code == 200
    assert_all_free(server.wait_idle(timeout=1.0), CONFIG.max_batch_size)
    assert engine_tokens(server) - before < 2000
    assert server.metric("interlock_requests_total", CANCELLED) == cancelled + 1


def test_disconnect_while_waiting_for_a_non_streamed_answer(server):
    before, cancelled = engine_tokens(server), server.metric("interlock_requests_total", CANCELLED)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=LONG, timeout=httpx.Timeout(30, read=0.5))
    assert_all_free(server.wait_idle(timeout=1.0), CONFIG.max_batch_size)
    assert engine_tokens(server) - before < 2000
    assert server.metric("interlock_requests_total", CANCELLED) == cancelled + 1


def test_disconnect_while_queued(tiny):
    """A request still waiting for a batch slot is dropped from the engine's queue too."""
    with LiveServer(tiny, EngineConfig(speculative=None, max_batch_size=1)) as srv:
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json={**LONG, "stream": True}, timeout=30) as held:
            lines = held.iter_lines()
            next(lines)
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(srv.url + "/v1/chat/completions", json={**LONG, "stream": True},
                           timeout=httpx.Timeout(30, read=0.5))
            # the queued one is gone from the server and the engine; the held one still runs
            assert eventually(lambda: srv.app_server.admission.in_flight == 1 and srv.resources()["requests"] == 1)
        assert_all_free(srv.wait_idle(timeout=1.0), 1)
