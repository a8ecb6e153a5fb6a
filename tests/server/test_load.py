"""A bounded load test on loopback that stops by itself: 300 requests at concurrency 32, mixed
endpoints, grammars and streaming, 20% of clients disconnecting at random points. Every
completed output is valid, nothing leaks, /health stays 200, and /metrics counts what the
clients saw."""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

import anyio
import httpx
import jsonschema
import pytest

from interlock.engine import EngineConfig
from interlock.protocol.speculative import SpeculativeConfig
from live import LiveServer, assert_all_free

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
REGEX = r"[a-z]{3,9}( [a-z]{2,5}){0,3}"
CHOICES = ["alpha", "beta", "gamma"]
GRAMMARS = {
    "none": {},
    "schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}},
    "regex": {"structured_outputs": {"regex": REGEX}},
    "choice": {"structured_outputs": {"choice": CHOICES}},
}
CONFIG = EngineConfig(speculative=SpeculativeConfig(("ngram", "forced"), max_draft_len=3), max_batch_size=8)


@dataclass(frozen=True)
class Job:
    chat: bool
    grammar: str
    stream: bool
    max_tokens: int
    cut_after: int | None       # disconnect after this many events (streams) / ms of reading (non-streamed)


@dataclass
class Seen:
    status: int = 0
    complete: bool = False      # the whole answer arrived
    text: str = ""
    finish: str | None = None
    completion_tokens: int = 0


def jobs(n: int, seed: int = 0) -> list[Job]:
    rng = random.Random(seed)
    return [Job(rng.random() < 0.8, rng.choice(list(GRAMMARS)), rng.random() < 0.7, rng.randint(4, 40),
                (rng.randint(0, 12) if rng.random() < 0.2 else None)) for _ in range(n)]


def body(job: Job) -> dict:
    base = {"model": "tiny", "max_tokens": job.max_tokens, "temperature": 0, **GRAMMARS[job.grammar]}
    base |= {"messages": [{"role": "user", "content": "Once upon a time"}]} if job.chat else {"prompt": "JSON please"}
    if job.stream:
        base |= {"stream": True, "stream_options": {"include_usage": True}}
    return base


async def run_job(client: httpx.AsyncClient, job: Job) -> Seen:
    seen = Seen()
    path = "/v1/chat/completions" if job.chat else "/v1/completions"
    if not job.stream:
        # a read timeout starts once the request is sent, so the server always sees the request
        timeout = httpx.Timeout(120, read=job.cut_after / 1000 + 1e-3 if job.cut_after is not None else 120)
        try:
            r = await client.post(path, json=body(job), timeout=timeout)
        except httpx.ReadTimeout:
            return seen
        seen.status = r.status_code
        if r.status_code == 200:
            out = r.json()
            c = out["choices"][0]
            seen.text = (c["message"]["content"] or "") if job.chat else c["text"]
            seen.finish, seen.complete = c["finish_reason"], True
            seen.completion_tokens = out["usage"]["completion_tokens"]
        return seen
    async with client.stream("POST", path, json=body(job)) as r:
        seen.status = r.status_code
        events = 0
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if job.cut_after is not None and events >= job.cut_after:
                break                                   # leaving the block closes the connection
            events += 1
            if line == "data: [DONE]":
                seen.complete = True
                break
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                seen.completion_tokens = chunk["usage"]["completion_tokens"]
            for c in chunk["choices"]:
                seen.text += (c["delta"].get("content") or "") if job.chat else c["text"]
                seen.finish = c["finish_reason"] or seen.finish
    return seen


def valid(job: Job, seen: Seen) -> bool:
    if seen.finish != "stop" or job.grammar == "none":
        return True                                     # cut by max_tokens, or unconstrained
    if job.grammar == "schema":
        jsonschema.validate(json.loads(seen.text), SCHEMA)
        return True
    if job.grammar == "regex":
        return re.fullmatch(REGEX, seen.text) is not None
    return seen.text in CHOICES


def load(srv: LiveServer, n: int, concurrency: int) -> list[tuple[Job, Seen]]:
    results: list[tuple[Job, Seen]] = []

    async def main() -> None:
        limiter = anyio.Semaphore(concurrency)
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=srv.url, timeout=120, limits=limits) as client:
            async def one(job: Job) -> None:
                async with limiter:
                    results.append((job, await run_job(client, job)))

            with anyio.fail_after(600):
                async with anyio.create_task_group() as tg:
                    for job in jobs(n):
                        tg.start_soon(one, job)

    anyio.run(main)
    return results


def check(srv: LiveServer, results: list[tuple[Job, Seen]], n: int) -> None:
    assert len(results) == n
    assert all(s.status in (0, 200) for _, s in results), [s.status for _, s in results if s.status not in (0, 200)]
    done = [(j, s) for j, s in results if s.complete]
    gone = [(j, s) for j, s in results if not s.complete]
    assert all(valid(j, s) for j, s in done)
    assert sum(1 for j, s in done if s.finish == "stop" and j.grammar != "none") > 0   # validity was checked
    assert len(gone) > n // 10                                                        # disconnects happened
    assert_all_free(srv.wait_idle(), CONFIG.max_batch_size)
    assert httpx.get(srv.url + "/health").status_code == 200
    count = {o: sum(srv.metric("interlock_requests_total", f'endpoint="{e}",outcome="{o}"')
                    for e in ("chat", "completions")) for o in ("ok", "cancelled", "bad_request", "rejected", "error")}
    assert count["bad_request"] == count["rejected"] == count["error"] == 0, count
    assert count["ok"] + count["cancelled"] == n, count
    # a client may leave after the server sent the last byte: the server then counts ok
    assert len(done) <= count["ok"] and count["cancelled"] <= len(gone), (count, len(done), len(gone))
    assert srv.metric("interlock_generation_tokens_total") >= sum(s.completion_tokens for _, s in done)
    assert srv.metric("interlock_admitted_requests") == 0


def test_load_300_requests_concurrency_32_with_disconnects(tiny):
    with LiveServer(tiny, CONFIG) as srv:
        check(srv, load(srv, 300, 32), 300)


@pytest.mark.soak
def test_load_soak(tiny):
    with LiveServer(tiny, CONFIG) as srv:
        check(srv, load(srv, 2000, 64), 2000)
