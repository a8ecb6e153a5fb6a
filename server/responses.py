"""Response bodies and stream chunks (pydantic), in OpenAI's shape, plus interlock's usage extension."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from interlock.protocol.sampling import RequestStats

OpenAIFinish = Literal["stop", "length", "tool_calls"]


class InterlockUsage(BaseModel):
    """interlock's own figures, under one extension key of `usage`."""

    steps: int
    drafted_tokens: int
    accepted_tokens: int
    mean_acceptance_length: float
    exposed_grammar_ms: float
    grammar_compile_ms: float
    attempts: int = 1                  # law="conditional": attempts drawn over the choices (1 per choice otherwise)
    rejected_tokens: int = 0           # law="conditional": tokens the rejected attempts drew


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    interlock: InterlockUsage

    @classmethod
    def of(cls, stats: list[RequestStats]) -> Usage:
        prompt = sum(s.prompt_tokens for s in stats)
        out = sum(s.output_tokens for s in stats)
        steps, step_tokens = sum(s.steps for s in stats), sum(s.step_tokens for s in stats)
        return cls(prompt_tokens=prompt, completion_tokens=out, total_tokens=prompt + out,
                   interlock=InterlockUsage(
                       steps=steps, drafted_tokens=sum(s.drafted for s in stats),
                       accepted_tokens=sum(s.accepted for s in stats),
                       mean_acceptance_length=round(step_tokens / steps, 4) if steps else 0.0,
                       exposed_grammar_ms=round(sum(s.exposed_grammar_ms for s in stats), 3),
                       grammar_compile_ms=round(sum(s.grammar_compile_ms for s in stats), 3),
                       attempts=sum(s.attempts for s in stats), rejected_tokens=sum(s.rejected_tokens for s in stats)))


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[dict[str, Any]] | None = None
    reasoning_content: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: OpenAIFinish
    logprobs: dict[str, Any] | None = None     # server/logprobs.py: OpenAI's shape for the endpoint


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChunkChoice(BaseModel):
    index: int
    delta: dict[str, Any]
    finish_reason: OpenAIFinish | None = None
    logprobs: dict[str, Any] | None = None     # server/logprobs.py: OpenAI's shape for the endpoint


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class TextChoice(BaseModel):
    index: int
    text: str
    finish_reason: OpenAIFinish | None
    logprobs: dict[str, Any] | None = None     # server/logprobs.py: OpenAI's shape for the endpoint


class TextCompletion(BaseModel):
    """Both the full /v1/completions answer and its stream chunks (OpenAI uses one object name)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "interlock"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
