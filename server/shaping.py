"""How one choice's deltas become OpenAI stream chunks and a final choice (chat or text, with or
without tool calls). The streamed pieces concatenate to exactly the non-streamed answer."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from interlock.output.reasoning import ReasoningStream
from interlock.protocol.grammar import Reasoning
from interlock.protocol.sampling import TokenLogprob
from interlock.protocol.types import FinishReason
from interlock.server.logprobs import TextLogprobs, TokenTexts, chat_logprobs
from interlock.server.responses import (
    AssistantMessage, ChatChoice, ChunkChoice, OpenAIFinish, TextChoice,
)
from interlock.server.tools import AutoToolStream, ToolCallStream


def is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class ChoiceShaper:
    """One choice of one request. Chat choices open with a role delta; tool-call choices stream
    tool-call deltas instead of content. With `texts` (the request asked for logprobs) each
    delta's logprobs ride on the first chunk its text makes, or on a later one when its text is
    held back; the streamed logprobs concatenate to the non-streamed ones."""

    def __init__(self, index: int, *, chat: bool, tools: bool, auto_tools: bool = False,
                 reasoning: Reasoning | None = None, texts: TokenTexts | None = None) -> None:
        self.index, self.chat = index, chat
        self.tools = ToolCallStream() if tools else None
        self.auto = AutoToolStream() if auto_tools and chat else None
        self.think = ReasoningStream.of_text(reasoning) if reasoning is not None and chat else None
        self.parts: list[str] = []
        self.texts = texts
        self.logprobs: list[TokenLogprob] = []       # every token's, for the whole answer
        self._unsent: list[TokenLogprob] = []        # not on a chunk yet
        self._text_lp = TextLogprobs(texts) if texts is not None and not chat else None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def opening(self) -> list[Any]:
        if not self.chat:
            return []
        return [ChunkChoice(index=self.index, delta={"role": "assistant", "content": None if self.tools else ""})]

    def piece(self, text: str, logprobs: Sequence[TokenLogprob] | None = None) -> list[Any]:
        if self.texts is not None:
            self.logprobs.extend(logprobs or ())
            self._unsent.extend(logprobs or ())
        if self.think is not None and not self.think.done:
            thought, text = self.think.feed((), text)
            out = [ChunkChoice(index=self.index, delta={"reasoning_content": thought})] if thought else []
            return self._with_logprobs(out + (self._answer(text) if text else []))
        return self._with_logprobs(self._answer(text))

    def _with_logprobs(self, chunks: list[Any]) -> list[Any]:
        """The unsent logprobs on the first of these chunks."""
        if chunks and self._unsent:
            chunks[0].logprobs = self._format(self._unsent)
            self._unsent = []
        return chunks

    def _format(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        assert self.texts is not None
        if self._text_lp is not None:
            return self._text_lp.piece(entries)
        return chat_logprobs(entries, self.texts)

    def _answer(self, text: str) -> list[Any]:
        self.parts.append(text)
        if not text:
            return []
        if self.tools is not None:
            return [ChunkChoice(index=self.index, delta={"tool_calls": [d]}) for d in self.tools.feed(text)]
        if self.auto is not None:
            return self._auto_chunks(*self.auto.feed(text))
        if self.chat:
            return [ChunkChoice(index=self.index, delta={"content": text})]
        return [TextChoice(index=self.index, text=text, finish_reason=None)]

    def finish_reason(self, reason: FinishReason) -> OpenAIFinish:
        if reason == "length":
            return "length"
        called = self.tools is not None and self.tools.name is not None and is_json(self.text)
        called = called or (self.auto is not None and self.auto.closed)
        return "tool_calls" if called else "stop"

    def closing(self, reason: FinishReason) -> list[Any]:
        finish = self.finish_reason(reason)
        if not self.chat:
            return self._with_logprobs([TextChoice(index=self.index, text="", finish_reason=finish)])
        out = []
        if self.think is not None and not self.think.done:
            thought = self.think.finish()
            out = [ChunkChoice(index=self.index, delta={"reasoning_content": thought})] if thought else []
        if self.auto is not None:
            out += self._auto_chunks(*self.auto.finish())
        if self.tools is not None:
            out = [ChunkChoice(index=self.index, delta={"tool_calls": [d]})
                   for d in self.tools.finish(is_json(self.text))]
        return self._with_logprobs(out + [ChunkChoice(index=self.index, delta={}, finish_reason=finish)])

    def full(self, reason: FinishReason) -> ChatChoice | TextChoice:
        choice = self._full(reason)
        if self.texts is not None:
            if self._text_lp is not None:
                self._text_lp = TextLogprobs(self.texts)          # offsets from the start of the text
            choice.logprobs = self._format(self.logprobs)
        if self.think is not None and isinstance(choice, ChatChoice):
            if not self.think.done:
                self.think.finish()
            choice.message.reasoning_content = self.think.reasoning
        return choice

    def _full(self, reason: FinishReason) -> ChatChoice | TextChoice:
        finish = self.finish_reason(reason)
        if not self.chat:
            return TextChoice(index=self.index, text=self.text, finish_reason=finish)
        if self.auto is not None:
            self.auto.finish()
            calls, content = self.auto.calls(), self.auto.content()
            return ChatChoice(index=self.index, finish_reason=finish,
                              message=AssistantMessage(content=content or (None if calls else ""),
                                                       tool_calls=calls or None))
        if self.tools is not None:
            found = self.tools.calls(is_json(self.text))
            if found:
                return ChatChoice(index=self.index, finish_reason=finish,
                                  message=AssistantMessage(content=None, tool_calls=found))
        return ChatChoice(index=self.index, finish_reason=finish, message=AssistantMessage(content=self.text))

    def _auto_chunks(self, content: str, calls: list[dict[str, Any]]) -> list[Any]:
        out = [ChunkChoice(index=self.index, delta={"content": content})] if content else []
        return out + [ChunkChoice(index=self.index, delta={"tool_calls": [d]}) for d in calls]

