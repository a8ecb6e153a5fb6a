"""`interlock serve` in a subprocess: SIGTERM / SIGINT with requests in flight drains them (short
ones finish, a long one is cut at the deadline with an error event and [DONE]), closes the
engine and exits 0 with no traceback."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

import interlock
from live import free_port

LONG = {"max_tokens": 4000, "structured_outputs": {"regex": "[0-9]{2000,}"}}


def start(port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(Path(interlock.__file__).parent.parent), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "interlock.cli", "--log-level", "info", "serve", "--model", "tiny", "--port", str(port),
         "--speculative", "none", "--max-batch-size", "4", "--shutdown-timeout", "5"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_healthy(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("server did not come up: " + proc.communicate()[1][-2000:])


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.soak)],
                         ids=["SIGTERM", "SIGINT"])
def test_signal_with_requests_in_flight(sig):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(port)
    try:
        wait_healthy(url, proc)
        events: dict[str, list[dict | str]] = {"short": [], "long": []}
        first = {k: threading.Event() for k in events}

        def stream(kind: str, extra: dict) -> None:
            body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True, **extra}
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        data = line[6:]
                        events[kind].append(data if data == "[DONE]" else json.loads(data))
                        first[kind].set()

        # the short one (16 tokens: well under a second even on a loaded machine) finishes in the 5 s drain
        # window; the long one (~10 s unloaded) is cut at its end
        threads = [threading.Thread(target=stream, args=("long", LONG)),
                   threading.Thread(target=stream, args=("short", {"max_tokens": 16}))]
        for t in threads:
            t.start()
        assert all(e.wait(60) for e in first.values())
        proc.send_signal(sig)
        for t in threads:
            t.join(60)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "Exception" not in err, err[-3000:]
    assert "engine_closed" in err
    short, long = events["short"], events["long"]
    assert short[-1] == "[DONE]" and short[-2]["choices"][0]["finish_reason"] == "length"
    assert long[-1] == "[DONE]" and long[-2]["error"]["code"] == "shutting_down"
