"""Per-request options through the official openai client: logprobs (chat and completions, streamed
and whole, equal to the engine's own), speculation on/off, the grammar backend, token-id prompts."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from interlock.protocol.grammar import JsonSchema, Regex
from interlock.protocol.sampling import SamplingParams
from live import SPEC, assert_all_free

MESSAGES = [{"role": "user", "content": "Once upon a time"}]
SHORT = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                          "n": {"type": "integer", "minimum": 0, "maximum": 9}},
         "required": ["city", "n"], "additionalProperties": False}
GRAMMARS = [
    {},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "short", "schema": SHORT, "strict": True}}},
    {"extra_body": {"structured_outputs": {"regex": r"[a-z]{3,9}( [a-z]{2,5}){0,3}"}}},
]
IDS = ["text", "json_schema", "regex"]


def entry(e) -> tuple:
    return e.token, round(e.logprob, 5), tuple(e.bytes), tuple((t.token, round(t.logprob, 5)) for t in e.top_logprobs)


@pytest.mark.parametrize("grammar", GRAMMARS, ids=IDS)
def test_chat_logprobs_whole_streamed_and_the_engine_agree(server, grammar):
    client = server.client()
    kw = dict(model="tiny", messages=MESSAGES, temperature=0, max_tokens=24, logprobs=True, top_logprobs=3, **grammar)
    # Warm the prefix cache first: a prompt prefilled from cached blocks computes its last chunk in
    # another shape than a cold one, which moves bfloat16 logits by a rounding step (the tokens
    # stay; the far alternatives' logprobs can move). Every run below then starts the same way.
    client.chat.completions.create(**kw)
    full = client.chat.completions.create(**kw)
    content = full.choices[0].logprobs.content
    assert len(content) == full.usage.completion_tokens > 0
    assert b"".join(bytes(e.bytes) for e in content).decode() == full.choices[0].message.content
    for e in content:
        assert e.logprob <= 0 and 1 <= len(e.top_logprobs) <= 3
        assert e.top_logprobs[0].token == e.token                     # greedy: the token is its row's best
    streamed = []
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            if c.logprobs is not None:
                streamed.extend(c.logprobs.content)
    assert [entry(e) for e in streamed] == [entry(e) for e in content]
    # the engine's own numbers for the same request
    grammar_spec = None
    if "response_format" in grammar:
        grammar_spec = JsonSchema(SHORT)
    elif grammar:
        grammar_spec = Regex(grammar["extra_body"]["structured_outputs"]["regex"])
    own = server.call(lambda: server.engine.complete(MESSAGES, grammar=grammar_spec, sampling=SamplingParams(
        max_tokens=24, logprobs=3)))
    assert [round(lp.logprob, 5) for lp in own.logprobs] == [round(e.logprob, 5) for e in content]
    assert_all_free(server.wait_idle(), SPEC.max_batch_size)


def test_chat_without_logprobs_has_none(server):
    full = server.client().chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=8)
    assert full.choices[0].logprobs is None
    full = server.client().chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=8,
                                                   logprobs=True)
    assert all(e.top_logprobs == [] for e in full.choices[0].logprobs.content)


def test_completions_logprobs_whole_and_streamed(server):
    client = server.client()
    kw = dict(model="tiny", prompt="The weather today", temperature=0.7, seed=3, max_tokens=20, logprobs=2)
    full = client.completions.create(**kw)
    lp = full.choices[0].logprobs
    assert "".join(lp.tokens) == full.choices[0].text and len(lp.tokens) == full.usage.completion_tokens
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(len(alts) <= 2 and all(v <= 0 for v in alts.values()) for alts in lp.top_logprobs)
    assert all(x <= 0 for x in lp.token_logprobs)
    parts = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            if c.logprobs is not None:
                for key in parts:
                    parts[key] += getattr(c.logprobs, key)
    assert parts == {"tokens": lp.tokens, "token_logprobs": lp.token_logprobs, "top_logprobs": lp.top_logprobs,
                     "text_offset": lp.text_offset}


@pytest.mark.parametrize("grammar", GRAMMARS, ids=IDS)
def test_speculative_off_per_request_equals_on(server, grammar):
    client = server.client()
    kw = dict(model="tiny", messages=MESSAGES, temperature=0, max_tokens=32, **grammar)
    extra = kw.pop("extra_body", {})
    on = client.chat.completions.create(**kw, extra_body={**extra, "speculative": True})
    off = client.chat.completions.create(**kw, extra_body={**extra, "speculative": False})
    assert off.choices[0].message.content == on.choices[0].message.content
    assert off.usage.completion_tokens == on.usage.completion_tokens
    assert off.usage.model_extra["interlock"]["drafted_tokens"] == 0
    assert off.usage.model_extra["interlock"]["mean_acceptance_length"] == 1.0


def test_speculative_drafts_when_on(server):
    drafted = 0
    for grammar in GRAMMARS:
        r = server.client().chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=32,
                                                    **grammar)
        drafted += r.usage.model_extra["interlock"]["drafted_tokens"]
    assert drafted > 0


def test_speculative_on_a_plain_server(plain):
    client = plain.client()
    off = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4,
                                         extra_body={"speculative": False})
    assert off.usage.completion_tokens > 0
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, extra_body={"speculative": True})
    assert bad.value.body["param"] == "speculative"


@pytest.mark.parametrize("backend", ["auto", "xgrammar", "llguidance"])
def test_grammar_backend_per_request_gives_valid_json(server, backend):
    fmt = {"type": "json_schema", "json_schema": {"name": "short", "schema": SHORT, "strict": True}}
    r = server.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "JSON please"}],
                                                n=3, seed=1, temperature=1.0, max_tokens=64, response_format=fmt,
                                                extra_body={"grammar_backend": backend})
    done = [c for c in r.choices if c.finish_reason == "stop"]
    assert done
    for c in done:
        jsonschema.validate(json.loads(c.message.content), SHORT)
    # the request compiled in its backend's own cache (this engine's default is auto)
    cache = server.engine.grammars.caches[backend]
    before = cache.stats()
    compiled = server.call(lambda: server.engine.grammars.compile(JsonSchema(SHORT), backend))
    assert cache.stats().hits == before.hits + 1 and cache.stats().misses == before.misses
    assert compiled.backend == (backend if backend != "auto" else "llguidance")     # auto tries llguidance first


def test_token_id_prompts(server, tiny):
    client = server.client()
    text = "The weather today"
    ids = tiny.tokenizer.encode(text)
    by_text = client.completions.create(model="tiny", prompt=text, temperature=0, max_tokens=12)
    by_ids = client.completions.create(model="tiny", prompt=ids, temperature=0, max_tokens=12)
    assert by_ids.choices[0].text == by_text.choices[0].text and by_ids.usage.prompt_tokens == len(ids)
    two = client.completions.create(model="tiny", prompt=[ids, ids[:2]], temperature=0, max_tokens=12)
    assert [c.index for c in two.choices] == [0, 1]
    assert two.choices[0].text == by_text.choices[0].text
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="tiny", prompt=[ids, [tiny.config.vocab_size + 5]], max_tokens=2)
    assert bad.value.body["param"] == "prompt"
    assert_all_free(server.wait_idle(), SPEC.max_batch_size)



def test_ignore_eos_with_a_grammar_is_a_400_naming_it(server):
    with pytest.raises(openai.BadRequestError) as bad:      # a grammar's stop token is the only end it allows
        server.client().completions.create(model="tiny", prompt="Item 1:", max_tokens=8, extra_body={
            "ignore_eos": True, "structured_outputs": {"regex": "[a-z]+"}})
    assert bad.value.body["param"] == "ignore_eos"
    assert_all_free(server.wait_idle(), SPEC.max_batch_size)
