"""Grammars that switch on mid-output (Reasoning, StructuralTag) behind the matcher protocol.

The public state machine (interlock.testing) drives accept / refused accept / rollback / multi-row
fill sequences that cross the switch (its `marker` token kind spells triggers), on both backends,
with single-token markers (special tokens added to the byte-level tokenizer) and multi-token ones
(the tiny SmolLM2 tokenizer, which has no <think> or <tool_call> token). Default profile: a few
derandomized examples per case; HYPOTHESIS_PROFILE=grammar-thorough runs 50 random ones x 50 steps.
"""
from __future__ import annotations

import asyncio
import os

import pytest
from hypothesis import settings

from interlock.actors.grammar_layer import GrammarLayer
from interlock.grammars import make_backend
from interlock.grammars.bitmask import allocate_bitmask, allowed_ids
from interlock.grammars.switch import SwitchMatcher, marker_ids
from interlock.grammars.validate import validate_output, validate_segments
from interlock.models.loader import TINY_PADDED_VOCAB
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import (Choice, GrammarConfig, JsonSchema, Reasoning, Regex, StructuralTag, Tag)
from interlock.testing import MatcherMismatch, byte_tokenizer, default_settings, grammar_case, machine_for
from interlock.testing.tokenizers import MARKERS

BACKENDS = ("xgrammar", "llguidance")
settings.register_profile("switch-default", default_settings(), max_examples=8, stateful_step_count=30,
                          derandomize=True, database=None)
settings.register_profile("grammar-thorough", default_settings(), max_examples=50, stateful_step_count=50)
PROFILE = settings.get_profile("grammar-thorough" if os.environ.get("HYPOTHESIS_PROFILE") == "grammar-thorough"
                               else "switch-default")

ARGS = JsonSchema({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
                   "required": ["a"]})
TOOL = StructuralTag(["<tool_call>"], [Tag("<tool_call>", ARGS, "</tool_call>")])
TWO_TAGS = StructuralTag(["<fn="], [Tag("<fn=a>", ARGS, "</fn>"), Tag("<fn=b>", Choice(["yes", "no"]), "</fn>")],
                         at_most=2)
THINK_JSON = Reasoning(then=ARGS)
THINK_FREE = Reasoning()
THINK_TOOL = Reasoning(then=StructuralTag(["<tool_call>"], [Tag("<tool_call>", ARGS, "</tool_call>")], at_most=1))
THINK_BUDGET = Reasoning(then=Choice(["yes", "no"]), max_reasoning_tokens=3)
SPECS = {"tool": TOOL, "two-tags": TWO_TAGS, "think-json": THINK_JSON, "think-free": THINK_FREE,
         "think-tool": THINK_TOOL, "think-budget": THINK_BUDGET}


@pytest.fixture(scope="module")
def marker_tok():
    """The byte-level tokenizer plus <think>, </think>, <tool_call>, </tool_call> as special tokens."""
    return byte_tokenizer(special=MARKERS)


@pytest.fixture(scope="module")
def marker_backends(marker_tok):
    return {n: make_backend(n, marker_tok, marker_tok.vocab_size + 5) for n in (*BACKENDS, "auto")}


# --- the rollback state machine across the switch -------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(SPECS))
def test_machine_single_token_markers(name, backend, marker_backends, marker_tok):
    case = grammar_case(SPECS[name], marker_backends[backend], marker_tok)
    machine_for(case, settings=PROFILE).TestCase().runTest()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["tool", "two-tags", "think-json", "think-tool", "think-budget"])
def test_machine_multi_token_markers(name, backend, tiny_backends, tiny_tokenizer):
    case = grammar_case(SPECS[name], tiny_backends[backend], tiny_tokenizer)
    machine_for(case, settings=PROFILE).TestCase().runTest()


class ForgetsInnerDepth(SwitchMatcher):
    """Planted bug: a rollback back into a tag does not roll its inner matcher back."""

    def _pop(self, n: int) -> None:
        if n > 0:
            del self._states[len(self._states) - n:]


@pytest.mark.parametrize("backend", BACKENDS)
def test_machine_finds_a_planted_rollback_bug_across_the_switch(backend, marker_backends, marker_tok):
    b = marker_backends[backend]
    case = grammar_case(TOOL, b, marker_tok,
                        matcher_factory=lambda c: ForgetsInnerDepth(c.compiled.native, b, marker_tok))
    with pytest.raises((MatcherMismatch, BaseExceptionGroup)):
        machine_for(case, settings=settings(PROFILE, max_examples=60)).TestCase().runTest()


# --- hand-written sequences --------------------------------------------------------------------

def _ids(tok, text):
    return tok.encode(text)


@pytest.mark.parametrize("backend", BACKENDS)
def test_free_rows_are_reported_and_left_unwritten(backend, marker_backends, marker_tok):
    b = marker_backends[backend]
    m = b.matcher(b.compile(TOOL))
    drafts = _ids(marker_tok, 'hi <tool_call>{"a":1}</tool_call>')
    call = drafts.index(marker_tok.encode("<tool_call>")[0])
    mask = allocate_bitmask(len(drafts) + 1, b.vocab_size)
    mask.fill_(0x12345678)
    before = mask.clone()
    free = [None] * (len(drafts) + 1)
    rows = m.fill_masks(mask, 0, drafts, free=free)
    assert rows == len(drafts) + 1 and m.num_accepted == 0
    # rows 0..call: free text (the row after the trigger is the tag's spec); after the end: free again
    assert free == [True] * (call + 1) + [False] * (len(drafts) - call - 1) + [True]
    for r, f in enumerate(free):
        assert bool((mask[r] == before[r]).all()) == f          # free rows untouched, others written
    # without the buffer a free row is written as every tokenizer id
    m.fill_masks(mask, 0, drafts[:1])
    assert allowed_ids(mask, 0, b.vocab_size) == list(range(marker_tok.vocab_size))


@pytest.mark.parametrize("backend", BACKENDS)
def test_rollback_across_the_switch_is_exact(backend, tiny_backends, tiny_tokenizer):
    b = tiny_backends[backend]
    tok = tiny_tokenizer
    m = b.matcher(b.compile(TOOL))
    ids = tok.encode('ok <tool_call>{"a":12}</tool_call> done')
    assert m.accept(ids)
    mask = allocate_bitmask(2, b.vocab_size)
    for back in range(len(ids), -1, -1):
        m.rollback(len(ids) - back) if back < len(ids) else None
        fresh = b.matcher(b.compile(TOOL))
        assert fresh.accept(ids[:back])
        assert m.fill_mask(mask, 0) == fresh.fill_mask(mask, 1)
        assert allowed_ids(mask, 0, b.vocab_size) == allowed_ids(mask, 1, b.vocab_size), back
        assert m.phase == fresh.phase and m.is_accepting() == fresh.is_accepting()
        assert m.accept(ids[back:])                         # and forward again over the switch


@pytest.mark.parametrize("backend", BACKENDS)
def test_forced_tokens_resume_after_the_marker(backend, tiny_backends, tiny_tokenizer):
    b, tok = tiny_backends[backend], tiny_tokenizer
    spec = StructuralTag(["<tool_call>"], [Tag('<tool_call>{"name":', JsonSchema({"type": "string"}), "</tool_call>")])
    m = b.matcher(b.compile(spec))
    assert m.accept(tok.encode("x ")) and m.forced_tokens() == []           # free text: nothing forced
    trigger = tok.encode("<tool_call>")
    assert m.accept(trigger[:3]) and m.forced_tokens() == []                # inside the trigger: still free
    assert m.accept(trigger[3:])
    assert tok.decode(m.forced_tokens()).startswith('{"name":')             # the rest of begin is forced
    assert m.accept(tok.encode('{"name":') + tok.encode('"f"'))
    assert tok.decode(m.forced_tokens()) == "</tool_call>"                  # spec complete: end forced
    assert m.accept(tok.encode("</tool_call>")) and m.phase == "free" and m.is_accepting()


@pytest.mark.parametrize("backend", BACKENDS)
def test_at_most_ends_the_output(backend, marker_backends, marker_tok):
    b, tok = marker_backends[backend], marker_tok
    spec = StructuralTag(["<tool_call>"], [Tag("<tool_call>", ARGS, "</tool_call>")], at_most=1)
    m = b.matcher(b.compile(spec))
    assert m.accept(tok.encode('<tool_call>{"a":1}</tool_call>')) and m.phase == "done"
    mask = allocate_bitmask(1, b.vocab_size)
    assert m.fill_mask(mask, 0) is False
    assert allowed_ids(mask, 0, b.vocab_size) == list(tok.eos_token_ids)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reasoning_refuses_eos_while_thinking_and_validates_the_answer(backend, marker_backends, marker_tok):
    b, tok = marker_backends[backend], marker_tok
    m = b.matcher(b.compile(THINK_JSON))
    eos = list(tok.eos_token_ids)
    assert m.accept(tok.encode("<think>let me see")) and not m.accept(eos) and not m.is_accepting()
    assert m.accept(tok.encode("</think>")) and m.phase == "inner"
    assert m.validate(tok.encode('{"b":true}')) < len(tok.encode('{"b":true}'))   # "a" is required
    assert m.accept(tok.encode('{"a":3}')) and m.accept(eos) and m.is_terminated()
    free = b.matcher(b.compile(THINK_FREE))
    assert free.accept(tok.encode("no end marker at all") + eos)                # free answer: may end


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_tags_share_a_trigger(backend, tiny_backends, tiny_tokenizer):
    b, tok = tiny_backends[backend], tiny_tokenizer
    m = b.matcher(b.compile(TWO_TAGS))
    assert m.accept(tok.encode("a<fn=b>yes</fn>b<fn=a>"))
    assert m.accept(tok.encode('{"a":1}</fn>')) and m.phase == "done"


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_reasoning_tokens_forces_the_end_marker(backend, tiny_backends, tiny_tokenizer):
    b, tok = tiny_backends[backend], tiny_tokenizer
    m = b.matcher(b.compile(THINK_BUDGET))
    end = tok.encode("</think>")
    assert m.forced_tokens() == [] and m.accept(tok.encode("so")[:1])
    assert m.accept([end[0]])                                  # the end marker begun within the budget
    assert m.accept(tok.encode("x")) and m.num_accepted == 3   # ... and abandoned: 3 tokens spent
    mask = allocate_bitmask(1, b.vocab_size)
    assert m.fill_mask(mask, 0) is False and allowed_ids(mask, 0, b.vocab_size) == [end[0]]
    assert tok.decode(m.forced_tokens()).startswith("</think>")  # the marker, then the answer's forced part
    assert not m.accept(tok.encode("y")) and m.accept(end) and m.phase == "inner"
    m.rollback(len(end))
    assert m.accept(end[:2]) and m.forced_tokens()[: len(end) - 2] == end[2:]   # mid-marker: its rest
    with pytest.raises(GrammarError):
        b.compile(Reasoning(then=ARGS, max_reasoning_tokens=-1))


# --- bad input -------------------------------------------------------------------------------

BAD = {
    "empty marker": Reasoning(then=ARGS, end=""),
    "overlapping triggers": StructuralTag(["<fn", "<fn="], [Tag("<fn=a>", ARGS, "</fn>")]),
    "nested trigger": StructuralTag(["<a>", "x<a>y"], [Tag("<a>", ARGS, "</a>"), Tag("x<a>y", ARGS, "</a>")]),
    "begin without trigger": StructuralTag(["<fn="], [Tag("<call>", ARGS, "</call>")]),
    "unused trigger": StructuralTag(["<fn=", "<call>"], [Tag("<fn=a>", ARGS, "</fn>")]),
    "begin prefix of another": StructuralTag(["<f"], [Tag("<f", ARGS, "</f>"), Tag("<fx", ARGS, "</f>")]),
    "tag spec fails to compile": StructuralTag(["<t>"], [Tag("<t>", Regex("(unclosed"), "</t>")]),
    "then fails to compile": Reasoning(then=JsonSchema({"type": "no-such-type"})),
    "nested tag spec": StructuralTag(["<t>"], [Tag("<t>", Reasoning(then=ARGS), "</t>")]),
    "nested reasoning": Reasoning(then=Reasoning(then=ARGS)),
    "at_most zero": StructuralTag(["<t>"], [Tag("<t>", ARGS, "</t>")], at_most=0),
    "eos in marker": StructuralTag(["<|end|>"], [Tag("<|end|>", ARGS, "</t>")]),
}


@pytest.mark.parametrize("backend", (*BACKENDS, "auto"))
@pytest.mark.parametrize("what", list(BAD))
def test_bad_specs_raise_grammar_error(what, backend, marker_backends):
    with pytest.raises(GrammarError):
        marker_backends[backend].compile(BAD[what])


def test_marker_that_is_no_token_sequence():
    """A tokenizer whose vocabulary cannot spell a marker (no byte fallback for it) refuses it."""
    tok = _ascii_tokenizer()
    assert marker_ids(tok, "end", "Reasoning.end") == tuple(tok.encode("end"))
    with pytest.raises(GrammarError, match="not a token sequence"):
        marker_ids(tok, "\u00e9nd", "Reasoning.end")


def _ascii_tokenizer():
    """The tokenizer with an unknown-token fallback instead of bytes for non-ASCII text: its
    encoding of a non-ASCII marker decodes to something else."""
    from tokenizers import Tokenizer as Raw
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from interlock.models.tokenizer import Tokenizer

    vocab = {chr(c): i for i, c in enumerate(range(32, 127))}
    vocab["<unk>"] = len(vocab)
    vocab["<eos>"] = len(vocab)
    raw = Raw(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    raw.decoder = decoders.Fuse()
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>", unk_token="<unk>")
    return Tokenizer(hf=hf, key="ascii-words", eos_token_ids=(vocab["<eos>"],))


def test_specs_are_hashable_with_canonical_keys(marker_tok):
    assert TOOL == StructuralTag(["<tool_call>"], [Tag("<tool_call>", ARGS, "</tool_call>")])
    assert hash(TOOL) == hash(StructuralTag(("<tool_call>",), (Tag("<tool_call>", ARGS, "</tool_call>"),)))
    keys = {s.key for s in (TOOL, TWO_TAGS, THINK_JSON, THINK_FREE, THINK_TOOL, Reasoning(then=ARGS, end="</t>"),
                            StructuralTag(["<tool_call>"], [Tag("<tool_call>", ARGS, "</tool_call>")], at_most=1))}
    assert len(keys) == 7

    async def twice():
        layer = GrammarLayer(marker_tok, marker_tok.vocab_size, GrammarConfig(backend="llguidance"))
        a, b = await layer.compile(TOOL), await layer.compile(TOOL)
        with pytest.raises(GrammarError):
            await layer.compile(BAD["tag spec fails to compile"])
        m = await layer.matcher(THINK_JSON)
        return a is b, layer.cache.stats().hits, m
    same, hits, m = asyncio.run(twice())
    assert same and hits == 1 and isinstance(m, SwitchMatcher)


def test_tiny_padded_vocab_masks_no_padding(tiny_backends, tiny_tokenizer):
    """The tiny model's V (1088) exceeds the tokenizer's 1024: a free row still allows no padding id."""
    b = tiny_backends["xgrammar"]
    assert b.vocab_size == TINY_PADDED_VOCAB
    m = b.matcher(b.compile(TOOL))
    mask = allocate_bitmask(1, b.vocab_size)
    assert m.fill_mask(mask, 0) is True
    assert allowed_ids(mask, 0, b.vocab_size) == list(range(tiny_tokenizer.vocab_size))


# --- segments and the end-of-output check ------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_segments_split_where_the_grammar_switched(backend, tiny_backends, tiny_tokenizer):
    b, tok = tiny_backends[backend], tiny_tokenizer
    m = b.matcher(b.compile(TWO_TAGS))
    parts = ["say <", "<fn=a>", '{"a":7}', "</fn>", " then ", "<fn=b>", "no", "</fn>"]
    ids = [t for p in parts for t in tok.encode(p)]
    assert m.accept(ids) and m.accept(list(tok.eos_token_ids))
    segs = m.segments()
    assert [s.kind for s in segs] == ["free", "marker", "constrained", "marker", "free", "marker", "constrained",
                                      "marker", "eos"]
    assert [tok.decode(s.ids) for s in segs[:-1]] == parts
    assert [s.tag for s in segs if s.kind == "constrained"] == [0, 1]
    assert all(s.complete for s in segs if s.kind == "constrained")
    validate_segments(segs, tok.decode)
    validate_output(TWO_TAGS, tok.decode(ids))
    m.rollback(len(tok.encode("</fn>")) + 1)                     # cut before the end marker
    last = m.segments()[-1]
    assert last.kind == "constrained" and not last.complete


@pytest.mark.parametrize("backend", BACKENDS)
def test_segments_of_reasoning_then_tool(backend, marker_backends, marker_tok):
    b, tok = marker_backends[backend], marker_tok
    m = b.matcher(b.compile(THINK_TOOL))
    parts = ["<think>", "hm", "</think>", "ok ", "<tool_call>", '{"a":1}', "</tool_call>"]
    assert m.accept([t for p in parts for t in tok.encode(p)] + list(tok.eos_token_ids))
    segs = m.segments()
    assert [(s.kind, tok.decode(s.ids)) for s in segs[:-1]] == [
        ("free", "<think>hm"), ("marker", "</think>"), ("free", "ok "), ("marker", "<tool_call>"),
        ("constrained", '{"a":1}'), ("marker", "</tool_call>")]
    validate_segments(segs, tok.decode)


def test_validate_output_of_switching_specs():
    validate_output(THINK_JSON, '<think>x</think>{"a":1}')
    validate_output(THINK_FREE, "no markers at all")
    validate_output(TOOL, 'text only')
    validate_output(TOOL, 'a <tool_call>{"a":1}</tool_call> b')
    validate_output(THINK_JSON, "<think>never ends")      # no marker in the text: cannot split, checks nothing
    for spec, text in [(THINK_JSON, '<think>x</think>{"a":"no"}'), (THINK_JSON, '</think>{"b":true}'),
                       (TOOL, '<tool_call>{"a":"x"}</tool_call>'), (TOOL, '<tool_call>{"a":1}'),
                       (TWO_TAGS, "<fn=b>yes</fn><fn=b>no</fn><fn=b>yes</fn>")]:
        with pytest.raises(GrammarError):
            validate_output(spec, text)
