"""The pure parts of the server: request -> engine calls, tool-call parsing and streaming."""
from __future__ import annotations

import dataclasses
import json

import pytest

from interlock.protocol.grammar import JsonSchema, Reasoning
from interlock.protocol.sampling import SamplingParams
from interlock.server.config import ServerConfig
from interlock.server.errors import APIError
from interlock.server.schemas import ChatCompletionRequest, CompletionRequest
from interlock.server.shaping import ChoiceShaper
from interlock.server.tools import ToolCallStream
from interlock.server.translate import EngineFacts, derived_seed, plan_chat, plan_completion

FACTS = EngineFacts(speculative=True, grammar_backend="auto")
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def chat(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw})


def test_defaults_and_sampling_mapping():
    request = chat(top_k=-1, top_p=1.0, stop="END", max_tokens=9, max_completion_tokens=7)
    plan = plan_chat(request, FACTS, ServerConfig())
    (call,) = plan.calls
    assert call.sampling == SamplingParams(temperature=1.0, top_k=None, top_p=None, max_tokens=7, stop=("END",))
    assert call.grammar is None and not plan.stream and not plan.tools


def test_n_derives_seeds_and_keeps_the_first():
    plan = plan_chat(chat(n=3, seed=5, temperature=0.5), FACTS, ServerConfig())
    seeds = [c.sampling.seed for c in plan.calls]
    assert seeds[0] == 5 and len(set(seeds)) == 3 and seeds == [derived_seed(5, i) for i in range(3)]
    assert [c.sampling.seed for c in plan_chat(chat(n=2), FACTS, ServerConfig()).calls] == [None, None]


def test_developer_role_and_content_parts():
    req = chat(messages=[{"role": "developer", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert plan_chat(req, FACTS, ServerConfig()).calls[0].prompt == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}]


def test_tools_required_constrains_and_describes_the_tools():
    plan = plan_chat(chat(tools=[TOOL], tool_choice="required"), FACTS, ServerConfig())
    call = plan.calls[0]
    assert plan.tools and plan.grammar_param == "tools" and isinstance(call.grammar, JsonSchema)
    assert call.grammar.schema_dict["properties"]["name"] == {"const": "get_weather"}
    assert call.prompt[0]["role"] == "system" and "get_weather" in call.prompt[0]["content"]


def test_penalties_map_or_are_refused_by_name():
    has = "presence_penalty" in {f.name for f in dataclasses.fields(SamplingParams)}
    if has:
        assert plan_chat(chat(presence_penalty=0.5), FACTS, ServerConfig()).calls[0].sampling.presence_penalty == 0.5
    else:
        with pytest.raises(APIError) as e:
            plan_chat(chat(presence_penalty=0.5), FACTS, ServerConfig())
        assert e.value.status == 400 and e.value.param == "presence_penalty"
    assert plan_chat(chat(presence_penalty=0.0), FACTS, ServerConfig()).calls   # 0 is no penalty: fine


PLAIN_FACTS = EngineFacts(speculative=False, grammar_backend="auto")


@pytest.mark.parametrize("body,facts,param", [
    ({"metadata": {}}, FACTS, "metadata"),
    ({"top_logprobs": 3}, FACTS, "top_logprobs"),                        # needs logprobs: true
    ({"logprobs": True, "top_logprobs": 21}, FACTS, "top_logprobs"),
    ({"speculative": True}, PLAIN_FACTS, "speculative"),                 # no speculation to turn on
    ({"grammar_backend": "outlines"}, FACTS, "grammar_backend"),
    ({"law": "exact"}, FACTS, "law"),
    ({"law": "conditional", "temperature": 0}, FACTS, "law"),                 # a search, which is not run
    ({"law": "conditional", "temperature": 1, "max_attempts": 0}, FACTS, "max_attempts"),
])
def test_unimplemented_or_bad_fields_are_400_naming_them(body, facts, param):
    with pytest.raises(APIError) as e:
        plan_chat(chat(**body), facts, ServerConfig())
    assert e.value.status == 400 and e.value.param == param
    if param == "grammar_backend":
        assert "outlines" in e.value.message


def test_logprobs_speculation_and_backend_map_per_request():
    (call,) = plan_chat(chat(logprobs=True, top_logprobs=4, speculative=False, grammar_backend="llguidance",
                             response_format={"type": "json_object"}), FACTS, ServerConfig()).calls
    assert call.sampling.logprobs == 4 and call.sampling.speculative is False
    assert call.grammar_backend == "llguidance"
    (call,) = plan_chat(chat(logprobs=True), PLAIN_FACTS, ServerConfig()).calls
    assert call.sampling.logprobs == 0 and call.sampling.speculative is True and call.grammar_backend is None
    (call,) = plan_chat(chat(logprobs=False, speculative=False), PLAIN_FACTS, ServerConfig()).calls
    assert call.sampling.logprobs is None and call.sampling.speculative is False
    (call,) = plan_chat(chat(ignore_eos=True), FACTS, ServerConfig()).calls
    assert call.sampling.ignore_eos is True
    (call,) = plan_chat(chat(), FACTS, ServerConfig()).calls
    assert call.sampling.ignore_eos is False


@pytest.mark.parametrize("prompt,want", [("hi", ["hi"]), (["a", "b"], ["a", "b"]), ([1, 2, 3], [[1, 2, 3]]),
                                         ([[1, 2], [3]], [[1, 2], [3]])])
def test_completion_prompts_text_or_token_ids(prompt, want):
    req = CompletionRequest.model_validate({"model": "m", "prompt": prompt, "logprobs": 2})
    plan = plan_completion(req, FACTS, ServerConfig())
    assert [c.prompt for c in plan.calls] == want and plan.calls[0].sampling.logprobs == 2


@pytest.mark.parametrize("body,param", [({"prompt": [[1], []]}, "prompt"), ({"prompt": []}, "prompt"),
                                        ({"prompt": "x", "logprobs": 21}, "logprobs"),
                                        ({"prompt": "x", "top_logprobs": 2}, "top_logprobs")])
def test_completion_bad_prompts_and_logprobs(body, param):
    with pytest.raises(APIError) as e:
        plan_completion(CompletionRequest.model_validate({"model": "m", **body}), FACTS, ServerConfig())
    assert e.value.status == 400 and e.value.param == param


def test_unknown_fields_sent_as_null_are_fine():
    assert plan_chat(chat(metadata=None, logit_bias=None), FACTS, ServerConfig()).calls


def test_tool_call_stream_pieces_add_up_to_the_call():
    text = '{"name":"get_weather","arguments":{"city":"Paris \\"x\\" }"}}'
    stream = ToolCallStream()
    deltas = [d for ch in text for d in stream.feed(ch)] + stream.finish(complete=True)
    assert deltas[0] == {"index": 0, "id": stream.call_id, "type": "function",
                         "function": {"name": "get_weather", "arguments": ""}}
    args = "".join(d["function"]["arguments"] for d in deltas)
    (call,) = stream.calls(complete=True)
    assert args == call["function"]["arguments"] == json.dumps({"city": 'Paris "x" }'}, separators=(",", ":"))


def test_shaper_falls_back_to_content_when_the_text_is_not_a_call():
    shaper = ChoiceShaper(0, chat=True, tools=True)
    shaper.piece('{"other":1}')
    choice = shaper.full("stop")
    assert choice.message.tool_calls is None and choice.message.content == '{"other":1}'
    assert choice.finish_reason == "stop"


@pytest.mark.parametrize("choice", [None, "auto"])
def test_tool_choice_auto_is_a_structural_tag(choice):
    from interlock.protocol.grammar import StructuralTag
    from interlock.server.tools import CALL_OPEN

    plan = plan_chat(chat(tools=[TOOL], tool_choice=choice), FACTS, ServerConfig())
    (call,) = plan.calls
    assert isinstance(call.grammar, StructuralTag) and call.grammar.triggers == (CALL_OPEN,)
    assert plan.auto_tools and not plan.tools and CALL_OPEN in call.prompt[0]["content"]


SCRIPTS = [
    ["Sure. ", "<tool", "_call>", '{"name":"get_weather",', '"arguments":{"city":"P</tool_call>"}}', "</tool_",
     "call>"],
    ["No tools needed: 1 < 2 and <tool", " is not a call."],
    ["<tool_call>", '{"name":"get_weather","arguments":{"ci'],                    # cut by max_tokens
]


@pytest.mark.parametrize("script", SCRIPTS, ids=["call", "content", "cut"])
def test_auto_tool_stream_pieces_add_up(script):
    """Content and call deltas streamed piece by piece add up to the non-streamed answer; a marker
    split across pieces is held back; a close marker inside a string argument is part of the call."""
    from interlock.server.tools import AutoToolStream

    whole = AutoToolStream()
    whole.feed("".join(script))
    whole.finish()
    parts = AutoToolStream()
    content, args = "", ""
    for piece in script:
        c, deltas = parts.feed(piece)
        content += c
        args += "".join(d["function"].get("arguments", "") for d in deltas)
    c, deltas = parts.finish()
    content += c
    args += "".join(d["function"].get("arguments", "") for d in deltas)
    assert content == whole.content() == parts.content()
    calls = whole.calls()
    assert [c["function"]["arguments"] for c in calls] == ([args] if calls else [])
    if script is SCRIPTS[0]:
        assert content == "Sure. " and whole.closed
        assert json.loads(calls[0]["function"]["arguments"]) == {"city": "P</tool_call>"}
    elif script is SCRIPTS[1]:
        assert content == "".join(script) and not calls
    else:
        assert content == "" and not whole.closed and calls[0]["function"]["name"] == "get_weather"


def test_reasoning_server_wraps_every_chat_grammar():
    from interlock.protocol.grammar import Reasoning

    plan = plan_chat(chat(tools=[TOOL]), FACTS, ServerConfig(reasoning=True))
    (call,) = plan.calls
    assert isinstance(call.grammar, Reasoning) and plan.reasoning and plan.auto_tools
    plain = plan_chat(chat(), FACTS, ServerConfig(reasoning=True)).calls[0].grammar
    assert plain == Reasoning()


def test_reasoning_markers_are_the_tokenizers():
    """A server whose tokenizer has its own thinking markers (EngineFacts, from the tokenizer) wraps
    chat grammars with those, and its outputs are split at them."""
    from dataclasses import replace

    facts = replace(FACTS, reasoning_markers=("<think>", "</think>"))
    plan = plan_chat(chat(), facts, ServerConfig(reasoning=True))
    assert plan.calls[0].grammar == Reasoning(start="<think>", end="</think>") == plan.reasoning
    facts = replace(FACTS, reasoning_markers=("<|begin_of_thought|>", "<|end_of_thought|>"))
    plan = plan_chat(chat(), facts, ServerConfig(reasoning=True))
    assert (plan.reasoning.start, plan.reasoning.end) == ("<|begin_of_thought|>", "<|end_of_thought|>")


def test_max_reasoning_tokens_extension():
    from interlock.protocol.grammar import Reasoning

    plan = plan_chat(chat(max_reasoning_tokens=16), FACTS, ServerConfig(reasoning=True))
    assert plan.calls[0].grammar == Reasoning(max_reasoning_tokens=16)
    with pytest.raises(APIError, match="--reasoning") as caught:
        plan_chat(chat(max_reasoning_tokens=16), FACTS, ServerConfig())
    assert caught.value.status == 400 and caught.value.param == "max_reasoning_tokens"
    with pytest.raises(ValueError):                        # pydantic: a negative budget is refused
        chat(max_reasoning_tokens=-1)


THINK_SCRIPTS = [
    ["<th", "ink>let me ", "see</thi", "nk>The answer", " is 4."],
    ["no start marker, ", "then </think>", "done"],
    ["<think>still thinking when cut"],
]


@pytest.mark.parametrize("script", THINK_SCRIPTS, ids=["split", "no-start", "cut"])
def test_reasoning_shaper_streams_what_it_returns_whole(script):
    from interlock.server.shaping import ChoiceShaper

    whole = ChoiceShaper(0, chat=True, tools=False, reasoning=Reasoning())
    whole.piece("".join(script))
    full = whole.full("stop").message
    streamed = ChoiceShaper(0, chat=True, tools=False, reasoning=Reasoning())
    chunks = [c for p in script for c in streamed.piece(p)] + streamed.closing("stop")
    thought = "".join(c.delta.get("reasoning_content", "") for c in chunks)
    content = "".join(c.delta.get("content", "") or "" for c in chunks)
    assert thought == full.reasoning_content and content == full.content
    expected = {"split": ("let me see", "The answer is 4."), "no-start": ("no start marker, then ", "done"),
                "cut": ("still thinking when cut", "")}
    assert (full.reasoning_content, full.content) == expected[["split", "no-start", "cut"][THINK_SCRIPTS.index(script)]]


@pytest.mark.parametrize("chat", [True, False])
def test_shaper_logprobs_ride_on_chunks_and_add_up_to_the_whole(chat):
    from interlock.protocol.sampling import TokenLogprob
    from interlock.server.logprobs import TokenTexts
    from interlock.testing.tokenizers import byte_tokenizer

    texts = TokenTexts(byte_tokenizer())
    lp = lambda ch, v: TokenLogprob(ord(ch), v, ((ord(ch), v), (ord("z"), -9.0)))   # noqa: E731 (byte ids)
    # text held back by the detokenizer ("" with tokens) must not lose its logprobs
    pieces = [("ab", [lp("a", -0.1), lp("b", -0.2)]), ("", [lp("c", -0.3)]), ("c", []), ("", [lp("d", -0.4)])]
    streamed = ChoiceShaper(0, chat=chat, tools=False, texts=texts)
    chunks = streamed.opening()
    for text, entries in pieces:
        chunks += streamed.piece(text, entries)
    chunks += streamed.closing("stop")
    whole = ChoiceShaper(0, chat=chat, tools=False, texts=texts)
    whole.piece("abc", [e for _, entries in pieces for e in entries])
    full = whole.full("stop").logprobs
    if chat:
        got = [e for c in chunks if c.logprobs for e in c.logprobs["content"]]
        assert got == full["content"] and [e["token"] for e in got] == ["a", "b", "c", "d"]
        assert got[0]["bytes"] == [97] and got[0]["top_logprobs"][1] == {"token": "z", "logprob": -9.0, "bytes": [122]}
    else:
        merged = {k: [x for c in chunks if c.logprobs for x in c.logprobs[k]] for k in full}
        assert merged == full and full["tokens"] == ["a", "b", "c", "d"] and full["text_offset"] == [0, 1, 2, 3]
        assert full["top_logprobs"][0] == {"a": -0.1, "z": -9.0}


@pytest.mark.parametrize("so,said,param", [
    ({"choice": []}, "structured_outputs.choice is empty", "structured_outputs.choice"),
    ({"regex": ""}, "structured_outputs.regex is empty", "structured_outputs.regex"),
    ({}, "got none", "structured_outputs"),
    ({"regex": "a", "choice": ["b"]}, "got ['regex', 'choice']", "structured_outputs"),
])
def test_structured_outputs_say_what_was_wrong_with_what_was_given(so, said, param):
    with pytest.raises(APIError) as info:
        plan_chat(chat(structured_outputs=so), FACTS, ServerConfig())
    assert said in info.value.message and info.value.param == param


@pytest.mark.parametrize("make,said", [
    (lambda: ServerConfig(max_queue=-1), "max_queue must be >= 0, got -1"),
    (lambda: ServerConfig(max_n=0), "max_n must be >= 1, got 0"),
])
def test_a_bad_server_config_names_its_field_and_value(make, said):
    with pytest.raises(ValueError, match=said):
        make()


@pytest.mark.parametrize("pieces,content", [
    (["You can call these", " tools. To call one, write ", "It is sunny."], "It is sunny."),
    (["You can call these tools."], ""),                        # cut inside the echo: nothing of it
    (["You can", " go now."], "You can go now."),                # not the instruction: all of it
    (["Yes", "."], "Yes."),
])
def test_the_tool_instruction_echoed_never_comes_back(pieces, content):
    """A model that opens its answer by repeating the injected tool_choice "auto" instruction does not
    send it back: streamed piece by piece and whole alike."""
    from interlock.server.tools import AUTO_PREAMBLE, AutoToolStream, auto_tools_prompt

    assert auto_tools_prompt([]).startswith(AUTO_PREAMBLE)          # the instruction opens with it
    for split in (pieces, ["".join(pieces)]):
        stream, said = AutoToolStream(), ""
        for piece in split:
            said += stream.feed(piece)[0]
        said += stream.finish()[0]
        assert said == content and stream.content() == content and stream.calls() == []


def test_law_and_max_attempts_map_to_sampling():
    plan = plan_chat(chat(law="conditional", max_attempts=7, temperature=1.0), FACTS, ServerConfig())
    assert [(c.sampling.law, c.sampling.max_attempts) for c in plan.calls] == [("conditional", 7)]
    assert plan_chat(chat(), FACTS, ServerConfig()).calls[0].sampling.law == "masked"
