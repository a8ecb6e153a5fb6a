"""benchmarks/kernel_quality.py on the tiny model: what it reads back is what decoding computes."""
from __future__ import annotations

import torch

from interlock.benchmarks.kernel_quality import greedy, log_probs, torch_int8
from interlock.models.linear import Int8Linear
from interlock.models.loader import load_model


def test_teacher_forced_rows_are_the_decode_steps(tiny) -> None:
    model = tiny.model
    prompt = list(range(30, 50))
    continuation = greedy(model, prompt, 20)          # more than one row chunk (16)
    lp = log_probs(model, prompt, continuation)
    assert lp.shape == (20, model.config.vocab_size)
    # Each row's argmax is the token greedy decoding chose there: the rows path reproduces decoding.
    assert lp.argmax(-1).tolist() == continuation
    assert torch.allclose(lp.exp().sum(-1), torch.ones(20, dtype=torch.float64))


def test_torch_int8_moves_every_projection_off_the_native_kernel() -> None:
    model = torch_int8(load_model("tiny").model)        # its own: torch_int8 changes the model
    assert model.fused_rows is None
    linears = [m for m in model.modules() if isinstance(m, Int8Linear)]
    assert linears and not any(m.native for m in linears)
    prompt = list(range(30, 40))
    assert bool(torch.isfinite(log_probs(model, prompt, greedy(model, prompt, 4))).all())
