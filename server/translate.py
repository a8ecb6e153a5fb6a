"""From an OpenAI request to engine calls: prompt, grammar, SamplingParams, one per choice.

Pure functions of the request and the engine's fixed configuration. Every field is either
mapped or refused with a 400 naming it; nothing is silently ignored.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any, Literal, cast

from interlock.protocol.conditional import Law
from interlock.protocol.errors import InterlockError
from interlock.protocol.grammar import (BACKENDS, BackendName, Choice, Ebnf, GrammarSpec, JsonObject, JsonSchema,
                                        Reasoning, Regex)
from interlock.protocol.sampling import MAX_LOGPROBS, SamplingParams
from interlock.server.config import ServerConfig
from interlock.server.errors import APIError, from_interlock, unsupported
from interlock.server.schemas import (
    ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields, StructuredOutputs,
)
from interlock.server.tools import auto_tools_grammar, call_text, tools_grammar, with_auto_tools, with_tools

Message = dict[str, str]
Prompt = str | list[Message] | list[int]
# Penalties exist in the engine only once SamplingParams has them (added by the reliability work).
_SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams))


@dataclass(frozen=True)
class EngineFacts:
    """What the server must know of its engine to check a request (all fixed at start)."""

    speculative: bool
    grammar_backend: BackendName
    reasoning_markers: tuple[str, str] = ("<think>", "</think>")    # the tokenizer's, where it has them


@dataclass(frozen=True)
class EngineCall:
    """One choice: the arguments of one Engine.generate call."""

    prompt: Prompt
    grammar: GrammarSpec | None
    sampling: SamplingParams
    negative_prompt: Prompt | None
    grammar_backend: BackendName | None = None     # None: the engine's


@dataclass(frozen=True)
class Plan:
    """A request translated: its choices and how to shape their outputs."""

    calls: tuple[EngineCall, ...]
    stream: bool
    include_usage: bool
    tools: bool                      # outputs are tool calls
    grammar_param: str | None        # the request field a GrammarError points at
    prompt_param: str                # the request field a prompt error points at
    auto_tools: bool = False         # tool_choice "auto": content, or content then one tool call
    reasoning: Reasoning | None = None   # outputs think first (ServerConfig.reasoning): between these markers


def message_text(m: ChatMessage) -> str:
    if m.tool_calls:
        return call_text(m)
    if isinstance(m.content, list):
        return "".join(p.text for p in m.content)
    return m.content or ""


def chat_messages(messages: list[ChatMessage], param: str = "messages") -> list[Message]:
    for i, m in enumerate(messages):
        # As OpenAI: only an assistant turn that calls a tool may leave out its content.
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            need = "content or tool_calls" if m.role == "assistant" else "content (a string or text parts)"
            raise APIError(400, f"{param}.{i}.content: a {m.role} message needs {need}, got null",
                           param=f"{param}.{i}.content", code="invalid_value")
    # "developer" is OpenAI's newer name for the system role; chat templates know "system".
    return [{"role": "system" if m.role == "developer" else m.role, "content": message_text(m)} for m in messages]


def derived_seed(seed: int | None, i: int) -> int | None:
    """Choice 0 keeps the seed (so n=1 equals the engine's own seeded output); the rest derive from it."""
    if seed is None or i == 0:
        return seed
    return random.Random(f"{seed}:{i}").getrandbits(63)


def check_common(req: SamplingFields, facts: EngineFacts, config: ServerConfig) -> None:
    req.refuse_unknown()
    if req.speculative and not facts.speculative:
        raise unsupported("speculative", "this engine runs without speculation (start the server with --speculative "
                                         "MODE); speculative: false is always accepted")
    if req.grammar_backend is not None and req.grammar_backend not in BACKENDS:
        raise APIError(400, f"grammar_backend {req.grammar_backend!r} is not a grammar backend: use one of "
                            f"{', '.join(BACKENDS)}", param="grammar_backend", code="invalid_value")
    if req.n is not None and req.n > config.max_n:
        raise APIError(400, f"n must be <= {config.max_n}, got {req.n}", param="n", code="invalid_value")
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options is only allowed with stream=true", param="stream_options")
    if req.negative_prompt is not None and req.guidance_scale is None:
        raise APIError(400, "negative_prompt needs guidance_scale", param="negative_prompt")


def sampling_params(req: SamplingFields, max_tokens: int | None, seed: int | None, config: ServerConfig,
                    logprobs: int | None = None) -> SamplingParams:
    extra: dict[str, Any] = {}
    for name, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0)):
        value = getattr(req, name)
        if value is not None and value != neutral:
            if name not in _SAMPLING_FIELDS:
                raise unsupported(name, "not supported yet (the engine has no penalties)")
            extra[name] = value
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    try:
        return SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=None if req.top_p in (None, 1.0) else req.top_p,
            top_k=None if req.top_k in (None, 0, -1) else req.top_k,
            max_tokens=max_tokens or config.default_max_tokens, stop=stop, seed=seed,
            guidance_scale=req.guidance_scale, logprobs=logprobs, ignore_eos=bool(req.ignore_eos),
            speculative=req.speculative is not False,
            law=cast(Law, req.law or "masked"),                 # SamplingParams refuses other names
            max_attempts=64 if req.max_attempts is None else req.max_attempts, **extra)
    except InterlockError as exc:
        raise from_interlock(exc) from exc


def structured_grammar(so: StructuredOutputs) -> GrammarSpec:
    fields = {"json": so.json_, "regex": so.regex, "choice": so.choice, "grammar": so.grammar,
              "json_object": so.json_object}
    given = [k for k, v in fields.items() if v is not None and v is not False]
    if len(given) != 1:
        raise APIError(400, f"structured_outputs needs exactly one of json, regex, choice, grammar, json_object; "
                            f"got {given or 'none'}", param="structured_outputs")
    name = given[0]
    if not fields[name] and name != "json":      # {} is a schema (anything); [] and "" say nothing
        unit = "option" if name == "choice" else "character"
        raise APIError(400, f"structured_outputs.{name} is empty: give at least one {unit}",
                       param=f"structured_outputs.{name}")
    try:
        if so.json_ is not None:
            return JsonSchema(so.json_)
        if so.regex is not None:
            return Regex(so.regex)
        if so.choice is not None:
            return Choice(so.choice)
        if so.grammar is not None:
            return Ebnf(so.grammar)
        return JsonObject()
    except InterlockError as exc:
        raise from_interlock(exc, "structured_outputs") from exc


def choose_grammar(req: ChatCompletionRequest | CompletionRequest, tools_spec: GrammarSpec | None
                   ) -> tuple[GrammarSpec | None, str | None]:
    """The one grammar a request asks for, and the field it came from; two at once is a 400."""
    found: list[tuple[GrammarSpec, str]] = []
    rf = req.response_format
    if rf is not None and rf.type == "json_object":
        found.append((JsonObject(), "response_format"))
    elif rf is not None and rf.type == "json_schema":
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise APIError(400, "response_format json_schema needs json_schema.schema", param="response_format")
        strict = rf.json_schema.strict is not False   # interlock always constrains; strict=false leaves objects open
        found.append((JsonSchema(rf.json_schema.schema_, strict=strict), "response_format"))
    if req.structured_outputs is not None:
        found.append((structured_grammar(req.structured_outputs), "structured_outputs"))
    if tools_spec is not None:
        found.append((tools_spec, "tools"))
    if len(found) > 1:
        raise APIError(400, f"{' and '.join(p for _, p in found)} each ask for a grammar; give one",
                       param=found[1][1])
    return found[0] if found else (None, None)


def tool_mode(req: ChatCompletionRequest) -> Literal["none", "call", "auto"]:
    """'call' when the output must be a tool call; 'auto' when the model chooses (free text that may
    switch into a call: a StructuralTag); 'none' when tools are only listed or absent."""
    if not req.tools:
        if req.tool_choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools", param="tool_choice")
        return "none"
    if req.tool_choice == "none":
        return "none"
    if req.tool_choice in (None, "auto"):
        return "auto"
    return "call"


def plan_chat(req: ChatCompletionRequest, facts: EngineFacts, config: ServerConfig) -> Plan:
    check_common(req, facts, config)
    logprobs = chat_logprobs(req)
    messages = chat_messages(req.messages)
    tools_spec: GrammarSpec | None = None
    mode = tool_mode(req)
    if mode == "auto":
        assert req.tools is not None
        try:
            tools_spec = auto_tools_grammar(req.tools)
        except InterlockError as exc:
            raise from_interlock(exc, "tools") from exc
        messages = with_auto_tools(messages, req.tools)
    elif mode == "call":
        assert req.tools is not None
        tools = req.tools
        if not isinstance(req.tool_choice, str):
            named = req.tool_choice.function.name if req.tool_choice is not None else ""
            tools = [t for t in req.tools if t.function.name == named]
            if not tools:
                raise APIError(400, f"tool_choice names {named!r}, which is not in tools", param="tool_choice")
        try:
            tools_spec = tools_grammar(tools)
        except InterlockError as exc:
            raise from_interlock(exc, "tools") from exc
        messages = with_tools(messages, tools)
    try:
        grammar, param = choose_grammar(req, tools_spec)
    except InterlockError as exc:
        raise from_interlock(exc, "response_format") from exc
    negative: Prompt | None = None
    if isinstance(req.negative_prompt, str):
        negative = [{"role": "user", "content": req.negative_prompt}]
    elif req.negative_prompt is not None:
        negative = chat_messages(req.negative_prompt, "negative_prompt")
    if config.reasoning:
        start, end = facts.reasoning_markers
        grammar = Reasoning(then=grammar, start=start, end=end, max_reasoning_tokens=req.max_reasoning_tokens)
    elif req.max_reasoning_tokens is not None:
        raise APIError(400, "max_reasoning_tokens needs a server that reasons (interlock serve --reasoning)",
                       param="max_reasoning_tokens")
    max_tokens = req.max_completion_tokens or req.max_tokens
    calls = tuple(EngineCall(messages, grammar, sampling_params(req, max_tokens, derived_seed(req.seed, i), config,
                                                                logprobs), negative, req.grammar_backend)  # type: ignore[arg-type]
                  for i in range(req.n or 1))
    return Plan(calls, bool(req.stream), bool(req.stream_options and req.stream_options.include_usage),
                mode == "call", param, "messages", auto_tools=mode == "auto",
                reasoning=grammar if isinstance(grammar, Reasoning) else None)


def plan_completion(req: CompletionRequest, facts: EngineFacts, config: ServerConfig) -> Plan:
    check_common(req, facts, config)
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_LOGPROBS:
        raise APIError(400, f"logprobs must be in [0, {MAX_LOGPROBS}], got {req.logprobs}", param="logprobs",
                       code="invalid_value")
    if req.echo:
        raise unsupported("echo")
    if req.suffix:
        raise unsupported("suffix")
    if req.best_of not in (None, 1):
        raise unsupported("best_of")
    if isinstance(req.negative_prompt, list):
        raise APIError(400, "negative_prompt must be a string on /v1/completions", param="negative_prompt")
    prompts = completion_prompts(req.prompt)
    try:
        grammar, param = choose_grammar(req, None)
    except InterlockError as exc:
        raise from_interlock(exc, "response_format") from exc
    n = req.n or 1
    calls = tuple(EngineCall(p, grammar, sampling_params(req, req.max_tokens, derived_seed(req.seed, i), config,
                                                         req.logprobs), req.negative_prompt,
                             req.grammar_backend)  # type: ignore[arg-type]
                  for p in prompts for i in range(n))
    return Plan(calls, bool(req.stream), bool(req.stream_options and req.stream_options.include_usage), False, param,
                "prompt")


def chat_logprobs(req: ChatCompletionRequest) -> int | None:
    """How many alternatives per token (None: no logprobs): OpenAI's logprobs + top_logprobs."""
    if req.top_logprobs is not None:
        if not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
        if not 0 <= req.top_logprobs <= MAX_LOGPROBS:
            raise APIError(400, f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {req.top_logprobs}",
                           param="top_logprobs", code="invalid_value")
    return (req.top_logprobs or 0) if req.logprobs else None


def completion_prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    """The prompts of a /v1/completions request: a string, strings, token ids, or lists of token ids
    (ids are checked against the vocabulary by the engine: a 400 naming prompt)."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(t, int) for t in prompt):
        return [prompt]  # type: ignore[list-item]
    prompts: list[str | list[int]] = list(prompt)  # type: ignore[arg-type]
    if not prompts or any(len(p) == 0 for p in prompts):
        raise APIError(400, "prompt must not be empty (nor any prompt in a list)", param="prompt")
    return prompts
