"""Tool calls: the grammar that constrains a call to the tools' schemas, the prompt that shows the
tools to the model, and the parser that turns the constrained text into OpenAI tool calls.

The model writes one call as compact JSON, `{"name":"NAME","arguments":{...}}`; the grammar (a
JSON schema, one branch per tool) fixes that shape, so the arguments always validate against
the named tool's `parameters`.
"""
from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

from interlock.protocol.grammar import JsonSchema
from interlock.server.schemas import ChatMessage, Tool

_HEADER = re.compile(r'\{"name":"([A-Za-z0-9_-]+)","arguments":')
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def call_schema(tool: Tool) -> dict[str, Any]:
    """The JSON schema of one call of `tool`: its name, then arguments valid for its parameters."""
    return {"type": "object",
            "properties": {"name": {"const": tool.function.name},
                           "arguments": tool.function.parameters or EMPTY_PARAMETERS},
            "required": ["name", "arguments"], "additionalProperties": False}


def tools_grammar(tools: Sequence[Tool]) -> JsonSchema:
    """One call of any of `tools` (a single tool: its schema alone, no anyOf)."""
    schemas = [call_schema(t) for t in tools]
    strict = all(t.function.strict is not False for t in tools)
    return JsonSchema(schemas[0] if len(schemas) == 1 else {"anyOf": schemas}, strict=strict)


def tools_prompt(tools: Sequence[Tool]) -> str:
    listing = [{"name": t.function.name, "description": t.function.description or "",
                "parameters": t.function.parameters or EMPTY_PARAMETERS} for t in tools]
    return ("You can call these tools. Answer with one call as a JSON object "
            '{"name": <tool name>, "arguments": <its arguments>}.\nTools: ' + json.dumps(listing))


def with_tools(messages: list[dict[str, str]], tools: Sequence[Tool]) -> list[dict[str, str]]:
    """The messages with the tools described in the system message (added first if there is none)."""
    text = tools_prompt(tools)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def call_text(message: ChatMessage) -> str:
    """An earlier assistant turn's tool calls, written back the way the model writes them."""
    calls = [{"name": c.function.name, "arguments": json.loads(c.function.arguments or "{}")}
             for c in message.tool_calls or ()]
    return "\n".join(json.dumps(c, separators=(",", ":")) for c in calls)


class ToolCallStream:
    """Feeds on the constrained text as it grows and yields OpenAI tool-call deltas.

    The first delta carries id, type and name once `{"name":"X","arguments":` is complete; later
    ones carry argument text. The last character is held back until the end, since the final `}`
    closes the call object, not the arguments. `finish()` returns the rest; `calls()` the whole
    call(s) for a non-streamed answer (the same text, so streamed == non-streamed).
    """

    def __init__(self) -> None:
        self.text = ""
        self.call_id = "call_" + uuid.uuid4().hex[:24]
        self.name: str | None = None
        self._args_start = 0
        self._sent = 0

    def feed(self, piece: str) -> list[dict[str, Any]]:
        self.text += piece
        out: list[dict[str, Any]] = []
        if self.name is None:
            m = _HEADER.match(self.text)
            if m is None:
                return out
            self.name, self._args_start = m.group(1), m.end()
            self._sent = m.end()
            out.append({"index": 0, "id": self.call_id, "type": "function",
                        "function": {"name": self.name, "arguments": ""}})
        return out + self._args_upto(len(self.text) - 1)

    def finish(self, complete: bool) -> list[dict[str, Any]]:
        """complete: the grammar finished (the last `}` closes the call); else the text was cut."""
        if self.name is None:
            return []
        return self._args_upto(len(self.text) - 1 if complete else len(self.text))

    def calls(self, complete: bool) -> list[dict[str, Any]]:
        self.feed("")
        if self.name is None:
            return []
        return [{"id": self.call_id, "type": "function",
                 "function": {"name": self.name,
                              "arguments": self.text[self._args_start:len(self.text) - (1 if complete else 0)]}}]

    def _args_upto(self, end: int) -> list[dict[str, Any]]:
        if end <= self._sent:
            return []
        piece, self._sent = self.text[self._sent:end], end
        return [{"index": 0, "function": {"arguments": piece}}]
