"""Bad input gets the right status and an OpenAI error body naming the field, for that request
only: a concurrent streamed request finishes with exactly the output it has alone."""
from __future__ import annotations

import dataclasses
import logging
import threading

import httpx
import openai
import pytest

from interlock.engine import EngineConfig
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig
from interlock.server import ServerConfig
from live import LiveServer, assert_all_free

SPEC = EngineConfig(speculative=SpeculativeConfig(("ngram", "forced"), max_draft_len=3), max_batch_size=4)
BASE = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
WEATHER = {"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}
HAS_PENALTIES = "presence_penalty" in {f.name for f in dataclasses.fields(SamplingParams)}

# (body overrides, endpoint, status, param or None)
BAD = [
    ({"temperature": -1}, "chat", 400, "temperature"),
    ({"top_p": 0}, "chat", 400, "top_p"),
    ({"n": 0}, "chat", 400, "n"),
    ({"n": 99}, "chat", 400, "n"),
    ({"max_tokens": 0}, "chat", 400, "max_tokens"),
    ({"foo": 1}, "chat", 400, "foo"),
    ({"top_logprobs": 2}, "chat", 400, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 99}, "chat", 400, "top_logprobs"),
    ({"tool_choice": {"type": "function", "function": {"name": "x"}}, "tools": [WEATHER]}, "chat", 400, "tool_choice"),
    ({"structured_outputs": {"regex": "[a-"}}, "chat", 400, "structured_outputs"),
    ({"structured_outputs": {"grammar": "root ::= ("}}, "chat", 400, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "chat", 400, "structured_outputs"),
    ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, "chat", 400,
     "structured_outputs"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
     "chat", 400, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "chat", 400, "response_format"),
    ({"response_format": {"type": "yaml"}}, "chat", 400, "response_format.type"),
    # a union field names the field, not the member pydantic tried ("...schema.dict[str,any]")
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "nope"}}}, "chat", 400,
     "response_format.json_schema.schema"),
    ({"messages": [{"role": "user", "content": 5}]}, "chat", 400, "messages.0.content"),
    ({"tool_choice": "sometimes", "tools": [WEATHER]}, "chat", 400, "tool_choice"),
    # OpenAI refuses a null content but for an assistant turn that calls a tool
    ({"messages": [{"role": "user", "content": None}]}, "chat", 400, "messages.0.content"),
    ({"messages": [{"role": "system", "content": "be brief"}, {"role": "assistant", "content": None}]}, "chat", 400,
     "messages.1.content"),
    # a regex that only the end-of-request check would refuse: refused before anything is generated
    ({"structured_outputs": {"regex": "ab\\"}}, "chat", 400, "structured_outputs"),
    ({"structured_outputs": {"regex": "\\"}, "stream": True}, "chat", 400, "structured_outputs"),
    ({"messages": []}, "chat", 400, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "chat", 400,
     None),
    ({"stop": [""]}, "chat", 400, None),
    ({"stream_options": {"include_usage": True}}, "chat", 400, "stream_options"),
    ({"grammar_backend": "outlines"}, "chat", 400, "grammar_backend"),
    ({"negative_prompt": "x"}, "chat", 400, "negative_prompt"),
    ({"messages": [{"role": "user", "content": "hello " * 5000}]}, "chat", 400, "messages"),
    ({"model": "nope"}, "chat", 404, "model"),
    ({"echo": True}, "completions", 400, "echo"),
    ({"logprobs": 21}, "completions", 400, "logprobs"),
    ({"prompt": [1, 2, 10**6]}, "completions", 400, "prompt"),
    ({"prompt": [[5, 6], [-1]]}, "completions", 400, "prompt"),
    ({"best_of": 2}, "completions", 400, "best_of"),
    ({"suffix": "x"}, "completions", 400, "suffix"),
    ({"prompt": []}, "completions", 400, "prompt"),
    ({"prompt": "hello " * 5000}, "completions", 400, "prompt"),
]
if not HAS_PENALTIES:
    BAD += [({name: 0.5}, "chat", 400, name)
            for name in ("presence_penalty", "frequency_penalty", "repetition_penalty")]


@pytest.fixture(scope="module")
def server(tiny):
    with LiveServer(tiny, SPEC) as srv:
        yield srv


def post(srv: LiveServer, endpoint: str, body: dict) -> httpx.Response:
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    if endpoint == "completions":
        body = {k: v for k, v in {**body, "prompt": body.get("prompt", "hi")}.items() if k != "messages"}
    return httpx.post(srv.url + path, json=body, timeout=60)


def check_error(r: httpx.Response, status: int, param: str | None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err


def test_bad_inputs_while_a_good_request_streams(server):
    good = dict(model="tiny", messages=[{"role": "user", "content": "Once upon a time"}], temperature=0,
                max_tokens=400, response_format={"type": "json_object"})
    alone = server.client().chat.completions.create(**good).choices[0].message.content
    streamed: list[str] = []
    started = threading.Event()

    def stream() -> None:
        for chunk in server.client().chat.completions.create(stream=True, **good):
            started.set()
            streamed.extend(c.delta.content or "" for c in chunk.choices)

    t = threading.Thread(target=stream)
    t.start()
    started.wait(30)
    for body, endpoint, status, param in BAD:
        check_error(post(server, endpoint, {**BASE, **body}), status, param)
    t.join(60)
    assert "".join(streamed) == alone
    assert_all_free(server.wait_idle(), SPEC.max_batch_size)
    assert server.metric("interlock_requests_total", 'endpoint="chat",outcome="bad_request"') >= \
        sum(1 for _, e, s, _ in BAD if e == "chat")


def test_malformed_and_oversized_bodies(server):
    r = httpx.post(server.url + "/v1/chat/completions", content=b'{"model": "tiny", not json', timeout=30,
                   headers={"content-type": "application/json"})
    check_error(r, 400, None)
    err = r.json()["error"]          # no field to name: the byte offset belongs in the message
    assert err["param"] is None and "at character 18" in err["message"] and "not valid JSON" in err["message"]
    refused = 'endpoint="chat",outcome="bad_request"'
    before = server.metric("interlock_requests_total", refused)
    big = {**BASE, "messages": [{"role": "user", "content": "x" * (server.config.max_body_bytes + 10)}]}
    check_error(post(server, "chat", big), 413, None)           # refused by its Content-Length, and counted
    assert server.metric("interlock_requests_total", refused) == before + 1

    def chunks():                                      # no Content-Length: the bytes are counted
        yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
        for _ in range(server.config.max_body_bytes // 65536 + 2):
            yield b"x" * 65536
        yield b'"}]}'

    check_error(httpx.post(server.url + "/v1/chat/completions", content=chunks(), timeout=30), 413, None)
    check_error(httpx.get(server.url + "/v1/nothing"), 404, None)


def test_openai_client_sees_typed_errors(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="tiny", messages=BASE["messages"], top_logprobs=3)
    assert bad.value.body["param"] == "top_logprobs" and "logprobs: true" in bad.value.body["message"]
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="tiny", messages=BASE["messages"], extra_body={"grammar_backend": "gbnf"})
    assert bad.value.body["param"] == "grammar_backend" and "'gbnf'" in bad.value.body["message"]
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="tiny", prompt=[1, 2, 10**6], max_tokens=2)
    assert bad.value.body["param"] == "prompt" and "1000000" in bad.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=BASE["messages"])


def test_api_key(tiny):
    with LiveServer(tiny, SPEC, ServerConfig(model_name="tiny", api_key="sekret")) as srv:
        with pytest.raises(openai.AuthenticationError):
            srv.client(api_key="wrong").chat.completions.create(**BASE)
        check_error(httpx.get(srv.url + "/v1/models"), 401, None)
        assert srv.client(api_key="sekret").chat.completions.create(**BASE).choices[0].finish_reason
        assert httpx.get(srv.url + "/health").status_code == 200


def test_queue_full_is_429_with_retry_after(tiny):
    config = EngineConfig(speculative=None, max_batch_size=1)
    with LiveServer(tiny, config, ServerConfig(model_name="tiny", max_queue=0)) as srv:
        # 4000 tokens of digits (the grammar refuses to stop sooner): in flight for seconds
        long = {**BASE, "max_tokens": 4000, "stream": True, "structured_outputs": {"regex": "[0-9]{2000,}"}}
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=long, timeout=60) as held:
            assert held.status_code == 200
            lines = held.iter_lines()                  # (dropping this iterator would close the response)
            next(lines)                                # admitted and streaming
            r = post(srv, "chat", BASE)
            check_error(r, 429, None)
            assert r.headers["retry-after"] == "1"
            with pytest.raises(openai.RateLimitError):
                srv.client().chat.completions.create(**BASE)
        assert_all_free(srv.wait_idle(), 1)
        assert srv.client().chat.completions.create(**BASE).choices[0].finish_reason   # room again
        assert srv.metric("interlock_requests_total", 'endpoint="chat",outcome="rejected"') == 2


class Exploding:
    """The target forward, failing once armed: an engine fault (a broken device, say), not a request's.
    (A raising user drafter no longer does it: that fails only the requests it drafted for.)"""

    def __init__(self, model) -> None:
        self.model = model
        self.armed = threading.Event()

    def __call__(self, *args, **kwargs):
        if self.armed.is_set():
            raise RuntimeError("the forward fell over")
        return self.model(*args, **kwargs)


def test_health_is_503_once_the_engine_failed(tiny):
    config = EngineConfig(speculative=SpeculativeConfig(("ngram",)), max_batch_size=2)
    with LiveServer(tiny, config) as srv:
        verifier = srv.engine._rt.actors[1]
        forward = verifier.model = Exploding(verifier.model)
        assert httpx.get(srv.url + "/health").json() == {"status": "ok"}
        assert post(srv, "chat", BASE).status_code == 200
        forward.armed.set()
        check_error(post(srv, "chat", BASE), 500, None)
        check_error(httpx.get(srv.url + "/health"), 503, None)
        assert post(srv, "chat", BASE).status_code in (500, 503)
        assert httpx.get(srv.url + "/metrics").status_code == 200
        assert srv.metric("interlock_requests_total", 'endpoint="chat",outcome="error"') >= 2


def test_a_keyword_no_backend_enforces_suggests_no_option_the_server_lacks(server):
    """The library's SchemaKeywordError advises `JsonSchema(..., lenient=True)`; the server has no such
    option, so its 400 names the keyword and leaves the advice out."""
    schema = {"type": "string", "not": {"const": "a"}}
    r = post(server, "chat", {**BASE, "response_format": {"type": "json_schema",
                                                         "json_schema": {"name": "x", "schema": schema}}})
    check_error(r, 400, "response_format")
    message = r.json()["error"]["message"]
    assert "'not'" in message and "lenient" not in message


def test_the_access_log_is_one_line_per_request_when_asked(tiny):
    """ServerConfig.access_log (`interlock serve --access-log`): uvicorn's access lines, off by default."""
    lines: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    access = logging.getLogger("uvicorn.access")
    for access_log in (False, True):
        with LiveServer(tiny, SPEC, ServerConfig(model_name="tiny", access_log=access_log)) as srv:
            access.addHandler(handler := Lines())           # after uvicorn set up its loggers
            try:
                check_error(post(srv, "chat", {**BASE, "temperature": -1}), 400, "temperature")
                assert httpx.get(srv.url + "/health").status_code == 200
            finally:
                access.removeHandler(handler)
        if not access_log:
            assert lines == []
    assert any("POST /v1/chat/completions" in line and "400" in line for line in lines), lines
    assert any("GET /health" in line and "200" in line for line in lines), lines
