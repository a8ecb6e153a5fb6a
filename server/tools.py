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

from interlock.protocol.grammar import JsonSchema, StructuralTag, Tag
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


# --- tool_choice "auto": free text that may switch into one call ---------------------------------
# The markers are Hermes/Qwen's (the chat templates that have tool calls mostly use them); a
# tokenizer with them as special tokens switches on one token, others on their text's tokens.

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


def auto_tools_grammar(tools: Sequence[Tool]) -> StructuralTag:
    """Free text; after CALL_OPEN one call of any of `tools`, then CALL_CLOSE and the end."""
    return StructuralTag([CALL_OPEN], [Tag(CALL_OPEN, tools_grammar(tools), CALL_CLOSE)], at_most=1)


# How the instruction for tool_choice "auto" opens. A small model may answer by repeating it;
# AutoToolStream drops such an echo at the start of the output, so the instruction never comes back.
AUTO_PREAMBLE = "You can call these tools. To call one, write "
AUTO_FIRST_SENTENCE = AUTO_PREAMBLE[:AUTO_PREAMBLE.index(".") + 1]


def auto_tools_prompt(tools: Sequence[Tool]) -> str:
    listing = [{"name": t.function.name, "description": t.function.description or "",
                "parameters": t.function.parameters or EMPTY_PARAMETERS} for t in tools]
    return (AUTO_PREAMBLE + CALL_OPEN
            + '{"name": <tool name>, "arguments": <its arguments>}' + CALL_CLOSE
            + "; otherwise answer in plain text.\nTools: " + json.dumps(listing))


def with_auto_tools(messages: list[dict[str, str]], tools: Sequence[Tool]) -> list[dict[str, str]]:
    text = auto_tools_prompt(tools)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


class AutoToolStream:
    """Splits a tool_choice "auto" output as it grows into content and tool-call deltas.

    Text before CALL_OPEN is content (a possible partial marker at the end is held back); after it,
    the call goes through a ToolCallStream until the CALL_CLOSE that follows a complete JSON call
    (one inside a string argument is part of the call). The pieces concatenate to `content()` and
    `calls()`, so streamed == non-streamed. An output that opens by repeating the injected
    instruction (AUTO_PREAMBLE) loses that echo: it is held back while it still could be one.
    """

    def __init__(self) -> None:
        self._pending = ""
        self._content: list[str] = []
        self.call: ToolCallStream | None = None
        self._body = ""                 # text after CALL_OPEN
        self._fed = 0                   # of _body, characters given to the ToolCallStream
        self._end: int | None = None    # where the call body ends (CALL_CLOSE found)
        self._opened = False            # past the point where the output could still echo AUTO_PREAMBLE

    @property
    def closed(self) -> bool:
        return self._end is not None

    def feed(self, piece: str) -> tuple[str, list[dict[str, Any]]]:
        """(content to send now, tool-call deltas to send now)."""
        if self.call is not None:
            return "", self._feed_call(piece)
        self._pending += piece
        if not self._opened:
            head = self._pending.lstrip()
            if len(head) < len(AUTO_PREAMBLE) and AUTO_PREAMBLE.startswith(head):
                return "", []            # could still be the instruction, echoed: hold it
            self._opened = True
            if head.startswith(AUTO_PREAMBLE):
                self._pending = head[len(AUTO_PREAMBLE):]
        at = self._pending.find(CALL_OPEN)
        if at >= 0:
            content, rest = self._pending[:at], self._pending[at + len(CALL_OPEN):]
            self._pending = ""
            self._content.append(content)
            self.call = ToolCallStream()
            return content, self._feed_call(rest)
        keep = _partial_suffix(self._pending, CALL_OPEN)
        content = self._pending[:len(self._pending) - keep]
        self._pending = self._pending[len(content):]
        self._content.append(content)
        return content, []

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """What is still held back: a partial marker that never completed (content), or the call's tail."""
        if self.call is None:
            rest, self._pending = self._pending, ""
            if not self._opened and rest.lstrip().startswith(AUTO_FIRST_SENTENCE):
                rest = ""                # the output ended inside an echo of the instruction
            self._content.append(rest)
            return rest, []
        deltas = self._feed_upto(self._end if self._end is not None else len(self._body))
        return "", deltas + self.call.finish(self.closed)

    def content(self) -> str:
        return "".join(self._content) + ("" if self.call is not None else self._pending)

    def calls(self) -> list[dict[str, Any]]:
        return [] if self.call is None else self.call.calls(self.closed)

    def _feed_call(self, piece: str) -> list[dict[str, Any]]:
        if self.closed:
            return []
        self._body += piece
        start = 0
        while (at := self._body.find(CALL_CLOSE, start)) >= 0:
            if _is_json(self._body[:at]):
                self._end = at
                return self._feed_upto(at)
            start = at + 1
        return self._feed_upto(len(self._body) - _partial_suffix(self._body, CALL_CLOSE))

    def _feed_upto(self, end: int) -> list[dict[str, Any]]:
        assert self.call is not None
        if end <= self._fed:
            return []
        piece, self._fed = self._body[self._fed:end], end
        return self.call.feed(piece)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of marker."""
    for k in range(min(len(text), len(marker) - 1), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
