"""Byte-level trigger matching (grammars/triggers.py): against a slow reference that searches the
whole free text, and through the switch matcher with SmolLM2's tokenizer, where the model's own
spelling of a trigger (" C" "ALL" ":") is not the tokenizer's ("C" "ALL" ":")."""
from __future__ import annotations

import random

import pytest

from interlock.grammars.bitmask import allocate_bitmask, allowed_ids
from interlock.grammars.switch import token_bytes
from interlock.grammars.triggers import FIRE, FREE_STEP, REFUSE, build_scan
from interlock.grammars.validate import validate_output, validate_segments
from interlock.protocol.grammar import JsonSchema, Reasoning, StructuralTag, Tag

BACKENDS = ("xgrammar", "llguidance")
ARGS = JsonSchema({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
SPEC = StructuralTag(["CALL:"], [Tag("CALL:", ARGS, "</call>")])


def reference(pieces: list[bytes], triggers: list[bytes]) -> tuple[str, int]:
    """Slow: the first token after which the free text holds a trigger; FIRE if the trigger ends
    exactly there, REFUSE if it ends inside that token; (FREE_STEP, n) if none does."""
    text = b""
    for k, piece in enumerate(pieces):
        text += piece
        ends = [text.find(t) + len(t) for t in triggers if t in text]
        if ends:
            return (FIRE if min(ends) == len(text) else REFUSE), k
    return FREE_STEP, len(pieces)


def walk(scan, ids: list[int]) -> tuple[str, int]:
    tail = b""
    for k, t in enumerate(ids):
        kind, out = scan.step(tail, t)
        if kind != FREE_STEP:
            return kind, k
        tail = out
    return FREE_STEP, len(ids)


@pytest.mark.parametrize("triggers", [["CALL:"], ["</think>"], ["<a>", "<b>"], ["aab"], ["\n\n"]])
def test_scan_agrees_with_a_full_text_search(triggers, big_tokenizer, big_backends):
    tok = big_tokenizer
    vocab = token_bytes(big_backends["llguidance"], tok)
    raw = [t.encode() for t in triggers]
    scan = build_scan(raw, [tuple(tok.encode(t)) for t in triggers], vocab, tok, big_backends["llguidance"].vocab_size)
    # Walks are chunks: a trigger (or a part of one) cut at random points, a token that runs past a
    # trigger's end, or filler; so they reach every outcome.
    crossing = sorted(i for i, v in enumerate(vocab) if any(v.startswith(t[j:]) and len(v) > len(t) - j
                                                            for t in raw for j in range(len(t))))[:40]
    filler = tok.encode(" x y z")
    rng = random.Random(16)

    def chunk() -> list[int]:
        roll = rng.random()
        if roll < 0.5:
            t = rng.choice(triggers)
            t = t[rng.randrange(len(t)):] if rng.random() < 0.3 else t[:rng.randint(1, len(t))]
            cuts = sorted(rng.sample(range(1, len(t)), rng.randint(0, len(t) - 1))) if len(t) > 1 else []
            return [i for a, z in zip([0, *cuts], [*cuts, len(t)]) for i in tok.encode(t[a:z])]
        return [rng.choice(crossing if roll < 0.7 else filler)]

    kinds = set()
    for _ in range(2000):
        ids = [i for _ in range(rng.randint(1, 4)) for i in chunk()]
        got = walk(scan, ids)
        assert got == reference([vocab[i] for i in ids], raw), [vocab[i] for i in ids]
        kinds.add(got[0])
    assert kinds == {FIRE, REFUSE, FREE_STEP}             # the walks reached every outcome
    for tail, refused in scan.refused.items():             # the precomputed rows say what step says
        assert set(allowed_ids(scan.rows[tail][None], 0, len(vocab))) == set(range(len(vocab))) - refused
        assert all(scan.step(tail, i)[0] == REFUSE for i in refused)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_trigger_fires_however_the_model_spells_it(backend, big_backends, big_tokenizer):
    tok, b = big_tokenizer, big_backends[backend]
    ids = tok.encode(' I will check. CALL:{"a":1}</call> ok')
    assert tok.encode("CALL:")[0] not in ids                  # the tokenizer's own spelling is absent
    m = b.matcher(b.compile(SPEC))
    assert m.accept(ids) and m.phase == "free" and m.is_accepting()
    segs = m.segments()
    assert [s.kind for s in segs] == ["free", "marker", "constrained", "marker", "free"]
    assert tok.decode(list(segs[1].ids)).endswith("CALL:") and segs[2].complete
    assert tok.decode(list(segs[2].ids)) == '{"a":1}'
    validate_segments(segs, tok.decode)
    validate_output(SPEC, tok.decode(ids))                     # the text split agrees


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_token_a_trigger_would_end_inside_is_refused(backend, big_backends, big_tokenizer):
    tok, b = big_tokenizer, big_backends[backend]
    vocab = token_bytes(b, tok)
    crossing = next(i for i, v in enumerate(vocab) if v.startswith(b":") and len(v) > 1)
    colon = tok.encode(":")
    m = b.matcher(b.compile(SPEC))
    assert m.accept(tok.encode("x CALL"))
    assert m.validate([crossing]) == 0 and m.validate(colon) == 1
    mask = allocate_bitmask(3, b.vocab_size)
    assert m.fill_mask(mask, 0) is False                       # not free here: one token is refused
    allowed = set(allowed_ids(mask, 0, b.vocab_size))
    assert crossing not in allowed and colon[0] in allowed and len(allowed) < tok.vocab_size
    m.rollback(m.num_accepted)
    free = [None] * 3
    m.fill_masks(mask, 0, tok.encode("x"), free=free)
    assert free[:2] == [True, True]                            # away from a trigger the rows stay free


@pytest.mark.parametrize("backend", BACKENDS)
def test_reasoning_end_marker_spelled_in_context(backend, big_backends, big_tokenizer):
    """'</think>' after a word: the grammar switches there; and when the budget runs out while the
    last tokens begin the marker, only the rest of it is forced."""
    tok, b = big_tokenizer, big_backends[backend]
    m = b.matcher(b.compile(Reasoning(then=ARGS)))
    assert m.accept(tok.encode("hm ok</think>")) and m.phase == "inner"
    begun = tok.encode("hm ok</")
    m = b.matcher(b.compile(Reasoning(then=ARGS, max_reasoning_tokens=len(begun))))
    assert m.accept(begun) and m.phase == "free"
    forced = m.forced_tokens()
    assert tok.decode(forced).startswith("think>")            # not a second "</"
    mask = allocate_bitmask(1, b.vocab_size)
    m.fill_mask(mask, 0)
    assert allowed_ids(mask, 0, b.vocab_size) == forced[:1]
    assert m.accept(forced) and m.phase == "inner"


@pytest.mark.parametrize("text", ["<think>hm, ok</think>{\"a\":1}", "hm ok</think>>{\"a\":1}", "no marker at all"])
def test_reasoning_stream_splits_where_the_text_holds_the_marker(text, big_tokenizer):
    """Fed token by token (any spelling of the marker, or a token that runs past it, as a native
    grammar may produce), the stream hands out exactly the thinking and the answer."""
    from interlock.output.reasoning import ReasoningStream

    tok = big_tokenizer
    ids = tok.encode(text)
    stream = ReasoningStream(tok, "<think>", "</think>")
    thought = answer = ""
    for n, t in enumerate(ids):
        a, b = stream.feed([t], tok.decode(ids[:n + 1])[len(tok.decode(ids[:n])):], final=n == len(ids) - 1)
        thought, answer = thought + a, answer + b
    head, sep, tail = text.removeprefix("<think>").partition("</think>")
    assert (thought, answer) == ((head, tail) if sep else (head, ""))
