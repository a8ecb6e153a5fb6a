"""Stream chunks as clients read them: each chunk holds at most one delta per choice index (OpenAI
never sends an index twice in a chunk), so a client that reads only `chunk.choices[0]`, as most do,
assembles the same answer as the non-streamed one. Checked with the official client reading
`choices[0]` only, and on the raw SSE bytes for n=1 and n=2, with tools and without."""
from __future__ import annotations

import json
from collections import Counter

import httpx
import jsonschema
import pytest

from interlock.server import ServerConfig

from live import SPEC, LiveServer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Lisbon", "Oslo"]},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"]}}}
ASK = [{"role": "user", "content": "Weather in Oslo for 2 days?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def first_choice_only(stream) -> tuple[str, str | None, str, str | None]:
    """(content, tool name, tool arguments, finish reason) read from `chunk.choices[0]` alone."""
    content, name, args, finish = "", None, "", None
    for chunk in stream:
        if not chunk.choices:
            continue                        # the usage chunk
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for call in choice.delta.tool_calls or []:
            name = call.function.name or name
            args += call.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, name, args, finish


@pytest.mark.parametrize("tool_choice", ["required", NAMED], ids=["required", "named"])
def test_a_streamed_tool_call_read_from_choices_0_is_the_whole_call(server, tool_choice):
    client = server.client()
    kw = dict(model="tiny", messages=ASK, tools=[WEATHER], tool_choice=tool_choice, temperature=0, max_tokens=64)
    (call,) = client.chat.completions.create(**kw).choices[0].message.tool_calls
    content, name, args, finish = first_choice_only(client.chat.completions.create(stream=True, **kw))
    assert (content, name, finish) == ("", "get_weather", "tool_calls")
    assert args == call.function.arguments
    jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])


def test_tool_choice_auto_read_from_choices_0_equals_the_whole_answer(server):
    client = server.client()
    kw = dict(model="tiny", messages=ASK, tools=[WEATHER], temperature=0, max_tokens=32)
    whole = client.chat.completions.create(**kw).choices[0]
    content, name, args, finish = first_choice_only(client.chat.completions.create(stream=True, **kw))
    calls = whole.message.tool_calls or []
    assert content == (whole.message.content or "") and finish == whole.finish_reason
    assert args == "".join(c.function.arguments for c in calls)
    assert name == (calls[0].function.name if calls else None)


def sse_events(url: str, path: str, body: dict) -> list[dict]:
    """Every `data:` event of a streamed response, parsed ([DONE] left out)."""
    events = []
    with httpx.stream("POST", url + path, json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: "):]))
    return events


def assert_unique_indices(events: list[dict], n: int) -> None:
    assert events, "no chunks"
    for event in events:
        assert "error" not in event, event
        counts = Counter(c["index"] for c in event["choices"])
        assert all(k == 1 for k in counts.values()), f"an index twice in one chunk: {event}"
    finished = Counter(c["index"] for e in events for c in e["choices"] if c.get("finish_reason"))
    assert finished == {i: 1 for i in range(n)}


CHAT_CASES = {
    "text": {},
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "w", "schema": WEATHER["function"]["parameters"]}}},
    "tools_required": {"tools": [WEATHER], "tool_choice": "required"},
    "tools_named": {"tools": [WEATHER], "tool_choice": NAMED},
    "tools_auto": {"tools": [WEATHER]},
}


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("case", list(CHAT_CASES))
def test_raw_chat_chunks_hold_each_index_once(server, case, n):
    body = {"model": "tiny", "messages": ASK, "stream": True, "n": n, "seed": 3, "max_tokens": 40,
            "stream_options": {"include_usage": True}, **CHAT_CASES[case]}
    events = sse_events(server.url, "/v1/chat/completions", body)
    assert_unique_indices(events, n)
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize("n", [1, 2])
def test_raw_completion_chunks_hold_each_index_once(server, n):
    body = {"model": "tiny", "prompt": "Once upon a time", "stream": True, "n": n, "seed": 3, "max_tokens": 16}
    assert_unique_indices(sse_events(server.url, "/v1/completions", body), n)


@pytest.fixture(scope="module")
def reasoning(tiny):
    with LiveServer(tiny, SPEC, ServerConfig(model_name="tiny", reasoning=True)) as srv:
        yield srv


@pytest.mark.parametrize("n", [1, 2])
def test_raw_chunks_of_a_reasoning_server_hold_each_index_once(reasoning, n):
    """Thinking and answer can come out of one step: still one delta per chunk."""
    body = {"model": "tiny", "messages": ASK, "stream": True, "n": n, "seed": 3, "max_tokens": 40,
            "max_reasoning_tokens": 4, "tools": [WEATHER], "tool_choice": "required"}
    events = sse_events(reasoning.url, "/v1/chat/completions", body)
    assert_unique_indices(events, n)
    assert any(c["delta"].get("reasoning_content") for e in events for c in e["choices"])
