"""Switching grammars (Reasoning, StructuralTag) through the engine: greedy speculative output equals
greedy plain output token for token with drafts crossing the switch, on both backends and with every
drafter, and every completed output's constrained part validates.

The tiny preset's random model does not know any marker, so the marker is taken from what it says:
its first greedy token unconstrained (it repeats it, so n-gram drafts run straight across the
switch and forced drafts resume right after it). The free phase is unconstrained, so the model
emits the marker there exactly as it would without a grammar.
"""
from __future__ import annotations

import pytest

from interlock.engine import Engine, EngineConfig
from interlock.grammars.switch import marker_ids
from interlock.grammars.validate import validate_output
from interlock.protocol.grammar import Choice, JsonSchema, Reasoning, StructuralTag, Tag
from interlock.protocol.sampling import SamplingParams

from helpers import SWITCH_PROMPT, SWITCH_SCHEMA, complete_switch, first_greedy_token_text

MODES = ["ngram", "forced", "ngram+forced", "self-draft+forced"]
SCHEMA = SWITCH_SCHEMA
GREEDY = SamplingParams(temperature=0.0, max_tokens=40)


@pytest.fixture(scope="module")
def marker(tiny) -> str:
    text = first_greedy_token_text(tiny)
    assert len(marker_ids(tiny.tokenizer, text, "test marker")) == 1
    return text


def specs(marker: str) -> dict:
    return {
        "reasoning": Reasoning(then=JsonSchema(SCHEMA), start="<think>", end=marker),
        "tags": StructuralTag([marker], [Tag(marker, JsonSchema(SCHEMA), "</call>")], at_most=2),
        "tags-choice": StructuralTag([marker], [Tag(marker + "=", Choice(["yes", "no"]), ";")]),
    }


async def outputs(tiny, spec, mode: str | None, backend: str):
    return await complete_switch(tiny, SWITCH_PROMPT, spec, mode, backend, GREEDY)


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("name", ["reasoning", "tags", "tags-choice"])
async def test_greedy_speculative_equals_plain_across_the_switch(tiny, marker, name, backend):
    spec = specs(marker)[name]
    plain = await outputs(tiny, spec, None, backend)
    whole = tiny.tokenizer.decode(list(plain.token_ids))
    assert marker in whole                                    # the switch happened
    if plain.finish_reason == "stop":
        validate_output(spec, whole)
    drafted = 0
    for mode in MODES:
        got = await outputs(tiny, spec, mode, backend)
        assert got.token_ids == plain.token_ids, f"{mode} differs"
        assert got.finish_reason == plain.finish_reason
        drafted += got.stats.drafted
        if mode == "forced":            # forced tokens resume after the marker (the rest of a begin, `{"`)
            assert got.stats.drafted > 0 and got.stats.accepted > 0
    assert drafted > 0                                        # it did speculate


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
async def test_constrained_parts_validate_token_level(tiny, marker, backend):
    """The engine's output replayed through the matcher: the split is where the grammar switched,
    and every complete constrained part satisfies its spec."""
    from interlock.grammars import make_backend
    from interlock.grammars.validate import validate_segments

    spec = specs(marker)["tags"]
    out = await outputs(tiny, spec, "ngram+forced", backend)
    b = make_backend(backend, tiny.tokenizer, tiny.config.vocab_size)
    m = b.matcher(b.compile(spec))
    assert m.accept(list(out.token_ids))
    segs = m.segments()
    assert any(s.kind == "constrained" and s.complete for s in segs)
    validate_segments(segs, tiny.tokenizer.decode)


@pytest.mark.parametrize("mode", ["ngram+forced", "self-draft+forced"])
async def test_free_rows_are_skipped_not_applied(tiny, marker, mode, monkeypatch):
    """The verifier (general or lean greedy path) and draft-side masking skip the rows where the
    grammar is free: no row that allows every tokenizer id is ever applied, while the constrained
    part's rows are."""
    import interlock.actors.draft_actor as draft_actor
    import interlock.actors.verifier_actor as verifier_actor
    import interlock.kernels.verify as verify
    from interlock.grammars.bitmask import allowed_ids

    applied: list[int] = []

    def spy(module):
        real = module.apply_token_bitmask_

        def apply(logits, bitmask, *, rows=None, skip=None, **kw):
            for r, sk in zip(rows.tolist(), skip.tolist()):
                if not sk:
                    applied.append(len(allowed_ids(bitmask, r, tiny.config.vocab_size)))
            return real(logits, bitmask, rows=rows, skip=skip, **kw)
        monkeypatch.setattr(module, "apply_token_bitmask_", apply)

    spy(verify)             # the verifier's masks (kernels/verify.py, the one law)
    spy(draft_actor)
    real_argmax = verifier_actor.native.masked_argmax

    def argmax(logits, bitmask, mask_rows, vocab, **kw):    # the verifier's lean greedy path
        applied.extend(len(allowed_ids(bitmask, r, tiny.config.vocab_size)) for r in mask_rows.tolist() if r >= 0)
        return real_argmax(logits, bitmask, mask_rows, vocab, **kw)
    monkeypatch.setattr(verifier_actor.native, "masked_argmax", argmax)
    real_head = type(tiny.model).head_argmax

    def head(self, x, bitmask, mask_rows, vocab):           # the same, with the head told the masks
        applied.extend(len(allowed_ids(bitmask, r, tiny.config.vocab_size)) for r in mask_rows.tolist() if r >= 0)
        return real_head(self, x, bitmask, mask_rows, vocab)
    monkeypatch.setattr(type(tiny.model), "head_argmax", head)
    spec = StructuralTag([marker], [Tag(marker, JsonSchema(SCHEMA), "</call>")])
    out = await outputs(tiny, spec, mode, "llguidance")
    assert marker in out.text and "</call>" in out.text          # free, constrained, free again
    assert applied, "the constrained part's rows were applied"
    assert max(applied) < tiny.tokenizer.vocab_size, "an all-ones (free) row was applied"


@pytest.mark.parametrize("mode", [None, "ngram+forced"])
async def test_reasoning_text_and_answer_stream_separately(tiny, marker, mode):
    """Delta.reasoning_text carries the thinking, Delta.text the answer (after the end marker, which
    max_reasoning_tokens forces after 3 thinking tokens); max_tokens counts both."""
    spec = Reasoning(then=JsonSchema(SCHEMA), max_reasoning_tokens=3)
    out = await outputs(tiny, spec, mode, "llguidance")
    tok = tiny.tokenizer
    end = tok.encode("</think>")
    ids = list(out.token_ids)
    assert ids[3:3 + len(end)] == end                          # forced right after the budget
    assert out.reasoning_text == tok.decode(ids[:3])
    assert out.text == tok.decode(ids[3 + len(end):]) and out.finish_reason == "stop"
    validate_output(JsonSchema(SCHEMA), out.text)
    validate_output(spec, out.reasoning_text + "</think>" + out.text)
    async with Engine(tiny, EngineConfig(speculative=None, max_batch_size=1)) as engine:
        cut = await engine.complete(SWITCH_PROMPT, grammar=spec, sampling=SamplingParams(temperature=0.0, max_tokens=2))
    assert cut.finish_reason == "length" and len(cut.token_ids) == 2 and cut.text == ""
    assert cut.reasoning_text == tok.decode(list(cut.token_ids))
