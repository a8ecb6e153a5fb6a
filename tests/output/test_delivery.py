"""Delivery's stop rules: end of sequence (cut, or kept for the matcher; off with ignore_eos),
max_tokens before a stop token that follows it, the context limit, and stop strings."""
from __future__ import annotations

from interlock.output.delivery import Output, cut_at_stop
from interlock.output.stream import OutputStream
from interlock.protocol.messages import RequestSpec
from interlock.protocol.sampling import SamplingParams
from interlock.testing.tokenizers import byte_tokenizer

EOS = 99


def test_cut_at_stop_cuts_at_the_first_eos_and_keeps_it_when_asked() -> None:
    params = SamplingParams()
    assert cut_at_stop([1, 2, EOS, 3, EOS], (EOS,), params, keep_stop=False) == ([1, 2], True)
    assert cut_at_stop([1, 2, EOS, 3], (EOS,), params, keep_stop=True) == ([1, 2, EOS], True)
    assert cut_at_stop([1, 2, 3], (EOS,), params, keep_stop=False) == ([1, 2, 3], False)
    assert cut_at_stop([1, EOS, 3], (EOS,), SamplingParams(ignore_eos=True), keep_stop=False) == ([1, EOS, 3], False)


async def output(**sampling: object) -> tuple[Output, int]:
    tok = byte_tokenizer()
    spec = RequestSpec("r", (ord("a"),), None, SamplingParams(**sampling))
    return Output.new(spec, OutputStream(8), tok), tok.eos_token_ids[0]


async def test_eos_ends_with_stop_and_is_not_delivered() -> None:
    out, eos = await output()
    assert out.emit([ord("h"), ord("i"), eos, ord("x")], (eos,), False) == "stop"
    assert out.output == [ord("h"), ord("i")] and out.pending[-1].text == "hi"


async def test_max_tokens_wins_over_a_stop_token_after_it() -> None:
    out, eos = await output(max_tokens=3)
    assert out.emit([ord("a"), ord("b")], (eos,), False) is None
    assert out.emit([ord("c"), eos], (eos,), False) == "length"     # one at a time, "c" was the last token
    assert out.output == [ord("a"), ord("b"), ord("c")]


async def test_the_context_limit_ends_with_length() -> None:
    out, eos = await output()
    assert out.emit([ord("a")], (eos,), at_context_limit=True) == "length"


async def test_a_stop_string_ends_with_stop_and_is_not_delivered() -> None:
    out, eos = await output(stop=("END",))
    reasons = [out.emit([t], (eos,), False) for t in b"okEN"]
    assert reasons == [None] * 4
    assert out.emit(list(b"Dmore"), (eos,), False) == "stop"
    assert "".join(d.text for d in out.pending) == "ok"
