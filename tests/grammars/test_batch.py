"""The batched step pass (grammars/batch.py) against the per-row path it replaces.

Random batches mixing both backends, plain and switching grammars, random histories, drafts the
grammar allows and refuses (EOS included), prefilled rows and rollbacks between steps: the
check's cuts, every valid mask row, the free flags, the commit's verdicts and the matchers' states
afterwards must all equal the per-row path's. And the rollback machine of interlock.testing passes
for a matcher whose every validate / fill_masks / accept goes through the batch pass.
"""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.grammars import make_backend
from interlock.grammars.batch import Drafted, StepMasks
from interlock.grammars.bitmask import allocate_bitmask, allowed_ids
from interlock.protocol.grammar import Choice, JsonSchema, Reasoning, Regex, StructuralTag, Tag
from interlock.testing import byte_tokenizer, default_settings, grammar_case, machine_for
from interlock.testing.tokenizers import MARKERS

K = 3
PER = K + 1
ARGS = JsonSchema({"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"},
                                                    "ok": {"type": "boolean"}}, "required": ["name"]})
SPECS = (ARGS, JsonSchema({"type": "array", "items": {"type": "integer"}, "maxItems": 3}, whitespace="flexible"),
         Regex("(ab|cd)+e?"), Choice(["yes", "no", "maybe"]), Reasoning(then=ARGS),
         StructuralTag(["<tool_call>"], [Tag("<tool_call>", Choice(["x", "yz"]), "</tool_call>")]))
BACKENDS = ("xgrammar", "llguidance")
EXAMPLES = 200 if os.environ.get("HYPOTHESIS_PROFILE") == "grammar-thorough" else 40


@pytest.fixture(scope="module")
def world():
    """(tokenizer, V, {(backend, spec index): (backend, compiled)}): V pads past the tokenizer."""
    tok = byte_tokenizer(special=MARKERS)
    vocab = tok.vocab_size + 40
    backends = {n: make_backend(n, tok, vocab) for n in BACKENDS}
    compiled = {(n, i): (b, b.compile(s)) for n, b in backends.items() for i, s in enumerate(SPECS)}
    return tok, vocab, compiled


def _allowed(matcher, vocab: int) -> list[int]:
    mask = allocate_bitmask(1, vocab)
    free = matcher.fill_mask(mask, 0)
    return allowed_ids(mask, 0, vocab) if not free else list(range(vocab))


def _walk(draw, matcher, vocab: int, steps: int) -> list[int]:
    """Up to `steps` tokens the matcher's masks allow (state unchanged)."""
    out: list[int] = []
    for _ in range(steps):
        ids = _allowed(matcher, vocab)
        if not ids or not matcher.accept([t := draw(st.sampled_from(ids))]):
            break
        out.append(t)
    matcher.rollback(len(out))
    return out


def _drafts(draw, matcher, vocab: int, eos: int) -> tuple[int, ...]:
    drafts = _walk(draw, matcher, vocab, draw(st.integers(0, K)))
    if draw(st.booleans()):                                   # one refused or odd token somewhere
        odd = draw(st.sampled_from([eos, -1, vocab - 1, 0, draw(st.integers(0, vocab - 1))]))
        drafts = drafts[:draw(st.integers(0, len(drafts)))] + [odd]
    return tuple(drafts[:K])


@settings(default_settings(), max_examples=EXAMPLES, derandomize=True, database=None)
@given(data=st.data())
def test_batched_pass_equals_the_per_row_path(world, data):
    tok, vocab, compiled = world
    draw, eos = data.draw, tok.eos_token_ids[0]
    keys = draw(st.lists(st.sampled_from(sorted(compiled)), min_size=1, max_size=6), label="grammars")
    twins = [(b.matcher(c), b.matcher(c)) for b, c in (compiled[k] for k in keys)]
    masks = StepMasks(draw(st.sampled_from([1, 2, 4])))
    for ref, mine in twins:
        prefix = _walk(draw, ref, vocab, draw(st.integers(0, 8)))
        assert ref.accept(prefix) and mine.accept(prefix)
    for _ in range(draw(st.integers(1, 3), label="steps")):
        _step(draw, twins, masks, vocab, eos)
        for ref, mine in twins:                               # a rollback between steps
            back = draw(st.integers(0, min(2, ref.num_accepted)))
            ref.rollback(back)
            mine.rollback(back)


def _step(draw, twins, masks: StepMasks, vocab: int, eos: int) -> None:
    b = len(twins)
    drafts = [_drafts(draw, ref, vocab, eos) for ref, _ in twins]
    garbage = torch.randint(-2**31, 2**31 - 1, (b * PER, allocate_bitmask(1, vocab).shape[1]), dtype=torch.int32,
                            generator=torch.Generator().manual_seed(draw(st.integers(0, 9))))
    theirs, ours = garbage.clone(), garbage.clone()
    cuts = [ref.validate(d) if d else 0 for (ref, _), d in zip(twins, drafts)]
    assert masks.check([Drafted(m, d, i * PER) for i, ((_, m), d) in enumerate(zip(twins, drafts))], ours) == cuts
    drafts = [d[:n] for d, n in zip(drafts, cuts)]
    skips = [frozenset(draw(st.sets(st.integers(0, len(d))), label="prefilled")) for d in drafts]
    _prefill(twins, drafts, skips, [theirs, ours], vocab)
    free_theirs, free_ours = torch.ones(b * PER, dtype=torch.bool), torch.ones(b * PER, dtype=torch.bool)
    counts = [ref.fill_masks(theirs, i * PER, d, s, free=free_theirs)
              for i, ((ref, _), d, s) in enumerate(zip(twins, drafts, skips))]
    assert masks.fill([Drafted(m, d, i * PER, s) for i, ((_, m), d, s) in enumerate(zip(twins, drafts, skips))],
                      ours, free_ours) == counts
    for i, n in enumerate(counts):
        rows = slice(i * PER, i * PER + n)                    # rows past n are never read
        assert torch.equal(free_theirs[rows], free_ours[rows])
        for row in range(rows.start, rows.stop):
            if not free_theirs[row]:
                assert torch.equal(theirs[row], ours[row]), (i, row - rows.start, drafts[i])
    tokens = []
    for i, (d, n) in enumerate(zip(drafts, counts)):          # accepted drafts, then a bonus token
        a = draw(st.integers(0, n - 1))
        row = i * PER + a
        allowed = list(range(vocab)) if free_theirs[row] else allowed_ids(theirs, row, vocab)
        bonus = draw(st.sampled_from(allowed)) if allowed and draw(st.booleans()) else draw(st.integers(-1, vocab))
        tokens.append([*d[:a], bonus])
    verdicts = [ref.accept(t) for (ref, _), t in zip(twins, tokens)]
    assert masks.commit([m for _, m in twins], tokens) == verdicts
    for ref, mine in twins:
        assert (ref.num_accepted, ref.is_terminated()) == (mine.num_accepted, mine.is_terminated())
        assert _allowed(ref, vocab) == _allowed(mine, vocab)


def _prefill(twins, drafts, skips, bitmasks, vocab: int) -> None:
    """Rows in skip hold their mask already (the draft model's rows): write them as it would."""
    scratch = allocate_bitmask(PER, vocab)
    free = [False] * PER
    for i, ((ref, _), d, skip) in enumerate(zip(twins, drafts, skips)):
        ref.fill_masks(scratch, 0, d, free=free)
        for j in skip:
            for bitmask in bitmasks:
                bitmask[i * PER + j] = scratch[j]


# --- the rollback machine, through the batch pass ----------------------------------------------

class Batched:
    """A matcher seen through StepMasks: each validate / fill_masks / accept is a batch of one (its
    own scratch rows, which only it writes, as the engine's rows are written only by its pass)."""

    def __init__(self, matcher, masks: StepMasks, vocab: int) -> None:
        self.inner, self.masks, self.vocab = matcher, masks, vocab

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def validate(self, token_ids) -> int:
        scratch = allocate_bitmask(len(token_ids) + 1, self.vocab)
        return self.masks.check([Drafted(self.inner, tuple(token_ids), 0)], scratch)[0]

    def fill_masks(self, bitmask, start_row, drafts, skip=(), free=None) -> int:
        scratch = allocate_bitmask(len(drafts) + 1, self.vocab)
        scratch[:] = bitmask[start_row:start_row + len(drafts) + 1]
        mine = [None] * (len(drafts) + 1) if free is not None else None
        n = self.masks.check([Drafted(self.inner, tuple(drafts), 0)], scratch)[0]
        count = self.masks.fill([Drafted(self.inner, tuple(drafts[:n]), 0, frozenset(skip))], scratch, mine)[0]
        bitmask[start_row:start_row + count] = scratch[:count]
        if free is not None:
            for j in range(count):
                if mine[j] is not None:
                    free[start_row + j] = mine[j]
        return count

    def accept(self, token_ids) -> bool:
        return self.masks.commit([self.inner], [list(token_ids)])[0]

    def rollback(self, n: int) -> None:
        self.masks.reset()
        self.inner.rollback(n)

    def reset(self) -> None:
        self.masks.reset()
        self.inner.reset()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec", [0, 1, 4], ids=["json", "json-flexible", "reasoning"])
def test_rollback_machine_through_the_batch_pass(world, backend, spec):
    tok, vocab, _ = world
    masks = StepMasks(2)
    case = grammar_case(SPECS[spec], backend, tok, vocab_size=vocab,
                        matcher_factory=lambda c: Batched(c.backend.matcher(c.compiled), masks, vocab))
    machine_for(case, settings=settings(default_settings(), max_examples=8, stateful_step_count=30,
                                        derandomize=True, database=None)).TestCase().runTest()
