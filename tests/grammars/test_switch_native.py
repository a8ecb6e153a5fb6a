"""Switching grammars compiled natively (`native=True`: xgrammar structural tags, llguidance Lark,
grammars/native_tags.py): an ordinary backend matcher, under the rollback state machine across the
switch, agreeing with the composing matcher on outputs both accept, and typed errors for what only
the composing matcher does."""
from __future__ import annotations

import os

import pytest
from hypothesis import settings

from interlock.grammars.bitmask import allocate_bitmask, allowed_ids
from interlock.grammars.switch import SwitchMatcher
from interlock.grammars.validate import validate_output
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import Choice, JsonSchema, Reasoning, StructuralTag, Tag
from interlock.testing import default_settings, grammar_case, machine_for
from interlock.testing.tokenizers import MARKERS, byte_tokenizer

BACKENDS = ("xgrammar", "llguidance")
PROFILE = (settings(default_settings(), max_examples=50, stateful_step_count=50)
           if os.environ.get("HYPOTHESIS_PROFILE") == "grammar-thorough"
           else settings(default_settings(), max_examples=12, stateful_step_count=30, derandomize=True, database=None))

ARGS = JsonSchema({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
                   "required": ["a"]})
SPECS = {
    "tool": StructuralTag(["<tool_call>"], [Tag("<tool_call>", ARGS, "</tool_call>")], native=True),
    "tool-once": StructuralTag(["<tool_call>"], [Tag("<tool_call>", ARGS, "</tool_call>")], at_most=1, native=True),
    "two-tags": StructuralTag(["<fn="], [Tag("<fn=a>", ARGS, "</fn>"), Tag("<fn=b>", Choice(["yes", "no"]), "</fn>")],
                              native=True),
    "think-json": Reasoning(then=ARGS, native=True),
    "think-free": Reasoning(native=True),
    "think-tool": Reasoning(then=StructuralTag(["<tool_call>"], [Tag("<tool_call>", ARGS, "</tool_call>")], at_most=1),
                            native=True),
}
TEXTS = {   # outputs each spec accepts (composing and native alike)
    "tool": 'hi <tool_call>{"a":1}</tool_call> and <tool_call>{"a":2,"b":true}</tool_call> bye',
    "tool-once": 'hi <tool_call>{"a":1}</tool_call>',
    "two-tags": 'x <fn=b>yes</fn> y <fn=a>{"a":3}</fn>',
    "think-json": 'hm, ok</think>{"a":3}',
    "think-free": "hm</think>anything",
    "think-tool": 'hm</think>sure <tool_call>{"a":1}</tool_call>',
}


def markers(spec) -> list[str]:
    if isinstance(spec, Reasoning):
        inner = markers(spec.then) if isinstance(spec.then, StructuralTag) else []
        return ["</think>", *inner]
    return [*spec.triggers, *(t.begin for t in spec.tags), *(t.end for t in spec.tags)]


def hinted(matcher, tokenizer, texts: list[str], switched: list[int] | None = None):
    """The native matcher plus `marker_hints` (the next token of a marker the accepted tokens begin,
    else the first token of each), so that the state machine's walks spell markers and cross the
    switch. The matcher itself is the backend's: only accept/rollback/reset are observed. Each
    accept that completes the first marker (the trigger, or Reasoning's end) appends to `switched`."""
    seqs = [tokenizer.encode(t) for t in texts]
    first = seqs[0]
    base = type(matcher)

    class Hinted(base):  # type: ignore[misc, valid-type]
        def accept(self, token_ids):
            ok = base.accept(self, token_ids)
            if ok:
                self.seen.extend(int(t) for t in token_ids)
                if switched is not None and self.seen[-len(first):] == first:
                    switched.append(len(self.seen))
            return ok

        def rollback(self, n):
            base.rollback(self, n)
            del self.seen[len(self.seen) - n:]

        def reset(self):
            base.reset(self)
            self.seen.clear()

        def marker_hints(self):
            # Until this walk has crossed the switch, only the first marker: the others (a tag
            # inside free reasoning text) would interleave with it and make crossings rare.
            crossed = any(self.seen[i: i + len(first)] == first for i in range(len(self.seen) - len(first) + 1))
            live = seqs if crossed else [first]
            hints = {s[k] for s in live for k in range(1, len(s)) if self.seen[-k:] == s[:k]}
            hints = hints or {s[0] for s in live}
            return sorted(t for t in hints if self.validate([t]) == 1)

    out = Hinted.__new__(Hinted)
    out.__dict__.update(matcher.__dict__)
    out.seen = []
    return out


# 12 derandomized examples: with 8, no llguidance walk of "tool" spelled the 7-token trigger.
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(SPECS))
def test_machine_native(name, backend, tiny_backends, tiny_tokenizer):
    b, tok = tiny_backends[backend], tiny_tokenizer
    spec = SPECS[name]
    switched: list[int] = []
    case = grammar_case(spec, b, tok,
                        matcher_factory=lambda c: hinted(b.matcher(c.compiled), tok, markers(spec), switched))
    machine_for(case, settings=PROFILE).TestCase().runTest()
    assert switched, "no walk crossed the switch"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(SPECS))
def test_native_is_an_ordinary_matcher_that_accepts_what_composing_accepts(name, backend, tiny_backends,
                                                                           tiny_tokenizer):
    b, tok = tiny_backends[backend], tiny_tokenizer
    spec = SPECS[name]
    compiled = b.compile(spec)
    assert compiled.backend == backend and not isinstance(b.matcher(compiled), SwitchMatcher)
    ids = tok.encode(TEXTS[name])
    for s in (spec, _composing(spec)):
        m = b.matcher(b.compile(s))
        assert m.accept(ids) and m.accept(tok.eos_token_ids[:1]), (s, TEXTS[name])
    validate_output(spec, TEXTS[name])
    m = b.matcher(compiled)
    free = [None] * (len(ids) + 1)
    mask = allocate_bitmask(len(ids) + 1, b.vocab_size)
    m.fill_masks(mask, 0, ids, free=free)
    assert free == [False] * len(free)                         # every row is written and applied
    assert len(allowed_ids(mask, 0, b.vocab_size)) > 1         # free text at the start


@pytest.mark.parametrize("backend", BACKENDS)
def test_native_refuses_what_the_spec_refuses(backend, tiny_backends, tiny_tokenizer):
    b, tok = tiny_backends[backend], tiny_tokenizer
    m = b.matcher(b.compile(SPECS["tool-once"]))
    assert m.accept(tok.encode('hi <tool_call>{"a":1}</tool_call>'))
    assert m.validate(tok.encode(" more")) == 0                # at_most=1: only EOS after the tag
    m = b.matcher(b.compile(SPECS["tool"]))
    assert m.accept(tok.encode("hi <tool_call>"))
    assert m.validate(tok.encode('{"b":true}')) < len(tok.encode('{"b":true}'))   # "a" is required
    m = b.matcher(b.compile(SPECS["think-json"]))
    assert m.accept(tok.encode("hm</think>")) and m.validate(tok.eos_token_ids[:1]) == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_native_typed_errors(backend, tiny_backends):
    b = tiny_backends[backend]
    with pytest.raises(GrammarError, match="max_reasoning_tokens"):
        b.compile(Reasoning(then=ARGS, max_reasoning_tokens=3, native=True))
    with pytest.raises(GrammarError):
        b.compile(StructuralTag(["<a"], [Tag("<a>", JsonSchema({"type": "nope"}), "</a>")], native=True))
    with pytest.raises(GrammarError, match="overlap"):
        b.compile(StructuralTag(["<a", "<ab"], [Tag("<a>", ARGS, "</a>"), Tag("<ab>", ARGS, "</a>")], native=True))


def test_native_refuses_special_token_markers():
    tok = byte_tokenizer(special=MARKERS)
    from interlock.grammars import make_backend
    for name in BACKENDS:
        b = make_backend(name, tok, tok.vocab_size)
        with pytest.raises(GrammarError, match="special token"):
            b.compile(StructuralTag(["<tool_call>"], [Tag("<tool_call>", ARGS, "</tool_call>")], native=True))


def test_auto_falls_back_between_backends_for_native(tiny_backends):
    """xgrammar's structural tags allow at_most 1 or None only: auto takes llguidance for 2, and
    the native key differs from the composing one (the compile cache keeps them apart)."""
    spec = StructuralTag(["<tool_call>"], [Tag("<tool_call>", ARGS, "</tool_call>")], at_most=2, native=True)
    with pytest.raises(GrammarError, match="at_most"):
        tiny_backends["xgrammar"].compile(spec)
    assert tiny_backends["auto"].compile(spec).backend == "llguidance"
    assert spec.key != _composing(spec).key


def _composing(spec):
    from dataclasses import replace
    return replace(spec, native=False) if isinstance(spec, Reasoning) else StructuralTag(
        spec.triggers, spec.tags, spec.at_most)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["tool", "two-tags", "think-tool"])
def test_native_rollback_across_the_switch_is_exact(name, backend, tiny_backends, tiny_tokenizer):
    """Every prefix of an output that crosses the switch (both ways for tags): rolled back to it,
    the matcher fills the mask a fresh matcher fed that prefix fills, then goes forward again."""
    b, tok = tiny_backends[backend], tiny_tokenizer
    compiled = b.compile(SPECS[name])
    ids = tok.encode(TEXTS[name])
    m = b.matcher(compiled)
    assert m.accept(ids)
    mask = allocate_bitmask(2, b.vocab_size)
    for back in range(len(ids), -1, -1):
        m.rollback(m.num_accepted - back)
        fresh = b.matcher(compiled)
        assert fresh.accept(ids[:back])
        m.fill_mask(mask, 0)
        fresh.fill_mask(mask, 1)
        assert allowed_ids(mask, 0, b.vocab_size) == allowed_ids(mask, 1, b.vocab_size), back
        assert m.is_accepting() == fresh.is_accepting() and m.forced_tokens() == fresh.forced_tokens()
        assert m.accept(ids[back:]) and m.num_accepted == len(ids)
        m.rollback(len(ids) - back)
