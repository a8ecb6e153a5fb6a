"""Request bodies of /v1/chat/completions and /v1/completions (pydantic).

Top-level fields the server does not implement are collected (extra="allow") and refused by
`refuse_unknown` unless they are null; nested objects forbid unknown keys outright. Fields
declared here are implemented, or checked and refused by name in translate.py.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from interlock.server.errors import unsupported

Strict = ConfigDict(extra="forbid")


class TextPart(BaseModel):
    model_config = Strict
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = Strict
    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = Strict
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = Strict
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = Strict
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's extension: exactly one of these."""

    model_config = Strict
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class FunctionDef(BaseModel):
    model_config = Strict
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = Strict
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = Strict
    name: str


class NamedToolChoice(BaseModel):
    model_config = Strict
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(BaseModel):
    model_config = Strict
    include_usage: bool | None = None


class SamplingFields(BaseModel):
    """What both endpoints share: sampling, streaming, structured output and interlock's extensions."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    model: str
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)          # extension; -1 or 0: off (vLLM's spelling)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = Field(default=None, ge=1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    user: str | None = None                                 # an end-user id for the caller's logs; no effect
    # interlock / vLLM extensions
    structured_outputs: StructuredOutputs | None = None
    grammar_backend: str | None = None                      # auto | xgrammar | llguidance (checked in translate)
    guidance_scale: float | None = None
    negative_prompt: str | list[ChatMessage] | None = None
    speculative: bool | None = None
    repetition_penalty: float | None = Field(default=None, gt=0)   # vLLM's extension; 1 is off
    ignore_eos: bool | None = None                          # vLLM's extension: run to max_tokens (benchmarks, tests)
    law: str | None = None                                  # "masked" (default) | "conditional" (checked in translate)
    max_attempts: int | None = None                         # law="conditional": attempts before a 400

    def refuse_unknown(self) -> None:
        """400 naming the first field this server does not know, unless it was sent as null."""
        for name, value in (self.model_extra or {}).items():
            if value is not None:
                raise unsupported(name, "not supported by this server")


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None                         # needs logprobs: true
    # interlock extension: with a server started with --reasoning, the end-of-thinking marker is forced
    # after this many thinking tokens (Reasoning.max_reasoning_tokens); an error otherwise.
    max_reasoning_tokens: int | None = Field(default=None, ge=0)


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]   # text(s), or token ids (one prompt or several)
    response_format: ResponseFormat | None = None          # extension on /v1/completions (vLLM has it too)
    logprobs: int | None = None                             # N: each token's logprob and N alternatives
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
