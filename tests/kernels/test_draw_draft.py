"""draw_draft: one draft token from draft logits, with q over the target vocabulary."""
from __future__ import annotations

import pytest
import torch

from interlock.kernels.sampling import draw_draft, request_generator
from interlock.protocol.sampling import SamplingParams


def test_greedy_is_the_argmax_with_no_q() -> None:
    logits = torch.tensor([0.0, 3.0, 1.0, 9.0])
    assert draw_draft(logits, SamplingParams(temperature=0.0), None, vocab_size=3) == (1, None)


def test_all_masked_gives_no_token() -> None:
    logits = torch.full((4,), float("-inf"))
    assert draw_draft(logits, SamplingParams(temperature=0.0), None, vocab_size=4) == (None, None)


def test_sampled_q_is_the_distribution_mapped_through_d2t_and_seeded() -> None:
    logits = torch.tensor([0.0, 1.0, 2.0])
    d2t = torch.tensor([5, 2, 9])                   # draft id 2 maps past the vocabulary: never drawn
    sp = SamplingParams(temperature=1.0, seed=3)
    token, q = draw_draft(logits, sp, request_generator(3), vocab_size=8, d2t=d2t)
    assert token in (5, 2) and q is not None and q.shape == (8,)
    torch.testing.assert_close(q[[5, 2]], torch.softmax(torch.tensor([0.0, 1.0]), 0))
    assert float(q.sum()) == pytest.approx(1.0)
    again, _ = draw_draft(logits, sp, request_generator(3), vocab_size=8, d2t=d2t)
    assert again == token


def test_sampling_without_a_generator_is_refused() -> None:
    with pytest.raises(ValueError, match="generator"):
        draw_draft(torch.zeros(3), SamplingParams(temperature=1.0), None, vocab_size=3)
