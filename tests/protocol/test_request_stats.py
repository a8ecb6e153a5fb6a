"""RequestStats' derived figures, and Completion assembled from a request's deltas."""
from __future__ import annotations

import pytest

from interlock.protocol.sampling import Completion, Delta, RequestStats


def stats(output_tokens: int, ttft_s: float, elapsed_s: float) -> RequestStats:
    return RequestStats(prompt_tokens=5, output_tokens=output_tokens, steps=1, step_tokens=output_tokens, drafted=0,
                        accepted=0, ttft_s=ttft_s, elapsed_s=elapsed_s, exposed_grammar_ms=0.0, grammar_compile_ms=0.0)


def test_tokens_per_s_is_the_decode_rate_after_the_first_token() -> None:
    assert stats(11, ttft_s=0.5, elapsed_s=1.5).tokens_per_s == pytest.approx(10.0)


@pytest.mark.parametrize("output_tokens, ttft_s, elapsed_s", [(1, 0.3, 0.3), (1, 0.3, 0.31), (4, 0.3, 0.3)],
                         ids=["one-token", "one-token-later", "all-in-the-first-step"])
def test_tokens_per_s_is_none_without_a_decode_phase(output_tokens, ttft_s, elapsed_s) -> None:
    """Not 0.0, which would say the request made no progress."""
    assert stats(output_tokens, ttft_s, elapsed_s).tokens_per_s is None


def test_a_completion_is_its_deltas_joined() -> None:
    last = stats(3, 0.1, 0.2)
    deltas = [Delta("a", (1,), reasoning_text="t"), Delta("bc", (2, 3), "stop", last)]
    done = Completion.of(deltas, with_logprobs=False)
    assert (done.text, done.token_ids, done.finish_reason, done.stats, done.reasoning_text, done.logprobs) == \
        ("abc", (1, 2, 3), "stop", last, "t", None)
    with pytest.raises(ValueError):
        Completion.of(deltas[:1], with_logprobs=False)          # not finished
