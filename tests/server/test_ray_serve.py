"""Replicas on Ray Serve: a local Ray instance (2 CPUs, loopback), 2 replicas of the tiny preset.

Requests spread over both replicas and answer what one engine answers; killing one replica's
process loses only the streams it was serving while the other replica's finish, and Ray starts
a replacement. Bounded: every wait has a timeout; the fixture shuts Serve and Ray down.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

ray = pytest.importorskip("ray", reason="the Ray Serve replicas need the [cluster] extra")
serve = pytest.importorskip("ray.serve")

from live import LiveServer, free_port

from interlock.engine import EngineConfig
from interlock.models.loader import LoadedModel
from interlock.protocol.speculative import SpeculativeConfig
from interlock.server import ServerConfig
from interlock.server.ray_serve import ReplicaConfig, build_app

# a batch of 8: one replica can hold every stream of the kill test (paused streams keep their slots)
ENGINE = {"speculative": "ngram+forced", "max_batch_size": 8}
PROMPTS = [f"Item {i}: the list of" for i in range(8)]
MAX_TOKENS = 48
# The kill test's streams run to KILL_TOKENS with no EOS: far longer than the few steps between the
# streams' first events and the kill, so the killed replica cannot have sent them in full (48 tokens
# could be generated and buffered by Serve's proxy before the kill, and then nothing was lost).
KILL_TOKENS = 2048


@pytest.fixture(scope="module")
def ray_url() -> Iterator[str]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = build_app("tiny", ServerConfig(model_name="tiny"),
                        ReplicaConfig.fixed(2, cpus_per_replica=0.5, health_check_period_s=1.0,
                                            graceful_shutdown_timeout_s=2.0, engine_options=ENGINE))
        serve.run(app, name="interlock", route_prefix="/", blocking=False)
        # Both replicas up before any request: otherwise the router sends everything to the one
        # that started first (each replica loads its model, the first load on a machine compiles
        # the native kernels).
        wait_for_running_replicas(2, timeout_s=120)
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def wait_for_running_replicas(n: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        app = serve.status().applications.get("interlock")
        if app is not None and any(d.replica_states.get("RUNNING", 0) >= n for d in app.deployments.values()):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{n} replicas were not running after {timeout_s} s: {serve.status()}")


@pytest.fixture(scope="module")
def reference(tiny: LoadedModel) -> dict[tuple[str, int], str]:
    """What one engine (the single-process server, same options) answers to each (prompt, max_tokens)."""
    spec = SpeculativeConfig.parse(ENGINE["speculative"], max_draft_len=3)
    keys = [(p, n) for n in (MAX_TOKENS, KILL_TOKENS) for p in PROMPTS]

    # all at once: greedy outputs do not depend on the batch (a law of its own), and eight long
    # streams in one batch take the time of one
    async def answer_all(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            return await asyncio.gather(*[client.post("/v1/completions", json=body(p, max_tokens=n))
                                          for p, n in keys])

    with LiveServer(tiny, EngineConfig(speculative=spec, max_batch_size=8), ServerConfig(model_name="tiny")) as srv:
        responses = asyncio.run(answer_all(srv.url))
    return {k: r.json()["choices"][0]["text"] for k, r in zip(keys, responses)}


def body(prompt: str, stream: bool = False, max_tokens: int = MAX_TOKENS) -> dict:
    long = {"ignore_eos": True} if max_tokens > MAX_TOKENS else {}
    return {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream, **long}


def test_requests_spread_over_both_replicas_and_equal_one_engine(ray_url: str, reference: dict) -> None:
    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=ray_url, timeout=60) as client:
            return await asyncio.gather(*[client.post("/v1/completions", json=body(p)) for p in PROMPTS * 2])

    # Ray's router picks a replica by the queue lengths it last probed: on a loaded machine (the suite's
    # other worker) one burst can all go to one replica, so up to three bursts, every answer checked
    replicas: set[str] = set()
    for _ in range(3):
        responses = asyncio.run(run())
        assert [r.status_code for r in responses] == [200] * len(responses)
        for prompt, r in zip(PROMPTS * 2, responses):
            assert r.json()["choices"][0]["text"] == reference[prompt, MAX_TOKENS]
        replicas |= {r.headers["x-interlock-replica"] for r in responses}
        if len(replicas) == 2:
            break
    assert len(replicas) == 2


@dataclass
class StreamResult:
    replica: str
    pid: int
    text: str
    done: bool             # the stream ended with [DONE]
    error: str | None


async def open_stream(client: httpx.AsyncClient, prompt: str, go: asyncio.Event,
                      opened: asyncio.Queue) -> StreamResult:
    """Read a stream's first event, report which replica serves it, wait for `go`, read the rest.
    While this waits the request stays in flight: its output buffer fills and it pauses."""
    async with client.stream("POST", "/v1/completions", json=body(prompt, stream=True, max_tokens=KILL_TOKENS)) as r:
        result = StreamResult(r.headers["x-interlock-replica"], int(r.headers["x-interlock-pid"]), "", False, None)
        lines = r.aiter_lines()

        def take(line: str) -> bool:
            if line == "data: [DONE]":
                result.done = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                if "error" in event:
                    result.error = event["error"].get("message", "error")
                else:
                    result.text += "".join(c["text"] for c in event["choices"])
                return True
            return False

        try:
            async for line in lines:
                if take(line):
                    break
            await opened.put(result)
            await go.wait()
            async for line in lines:
                take(line)
        except httpx.HTTPError as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        return result


def test_killing_a_replica_loses_only_its_streams_and_ray_restarts_it(ray_url: str, reference: dict) -> None:
    async def run() -> tuple[list[StreamResult], int]:
        go, opened = asyncio.Event(), asyncio.Queue(maxsize=len(PROMPTS))   # one entry per stream
        async with httpx.AsyncClient(base_url=ray_url, timeout=httpx.Timeout(60, read=30)) as client:
            tasks = [asyncio.ensure_future(open_stream(client, p, go, opened)) for p in PROMPTS]
            try:
                first = [await asyncio.wait_for(opened.get(), 60) for _ in PROMPTS]
                assert len({s.replica for s in first}) == 2, "both replicas must hold streams before the kill"
                victim = first[0].pid
                os.kill(victim, signal.SIGKILL)
                go.set()
                # the survivor runs its streams to KILL_TOKENS each, on a machine the suite's other
                # worker shares: minutes at worst, not the seconds the first events took
                return list(await asyncio.wait_for(asyncio.gather(*tasks), 240)), victim
            finally:
                for t in tasks:
                    t.cancel()

    results, victim = asyncio.run(run())
    by_prompt = dict(zip(PROMPTS, results))
    lost = [p for p, s in by_prompt.items() if not s.done or s.error]
    assert lost, "the killed replica was serving streams; they cannot have finished"
    for prompt, s in by_prompt.items():
        if s.pid == victim:
            assert prompt in lost
        else:                                   # the survivor's streams finish, unchanged
            assert s.done and s.error is None and s.text == reference[prompt, KILL_TOKENS]

    # Ray replaces the dead replica: within a bounded time two replicas answer again, one of them new.
    deadline, pids = time.monotonic() + 120, set()
    with httpx.Client(base_url=ray_url, timeout=30) as client:
        while time.monotonic() < deadline and not (len(pids) >= 2 and victim not in pids):
            r = client.post("/v1/completions", json=body(PROMPTS[0]))
            if r.status_code == 200:
                assert r.json()["choices"][0]["text"] == reference[PROMPTS[0], MAX_TOKENS]
                pids = {int(r.headers["x-interlock-pid"])} | {p for p in pids if p != victim}
            time.sleep(0.2)
    assert len(pids) >= 2 and victim not in pids
