"""kernels/conditional.py against its slow reference: the trie-adjusted target of a verify row."""
from __future__ import annotations

import torch

from interlock.kernels.conditional import allowed_mass, conditional_target, live_weights
from interlock.kernels.conditional_reference import conditional_target_reference


def test_conditional_target_matches_the_reference() -> None:
    g = torch.Generator().manual_seed(0)
    r, v = 6, 11
    p = torch.softmax(torch.randn(r, v, generator=g), -1)
    allowed = torch.rand(r, v, generator=g) < 0.6
    allowed[:, 0] = True
    known = torch.tensor([True, False, True, True, False, True])
    live = [{0: 0.5, 3: 0.0}, {}, {}, {0: 0.2, 1: 0.7, 2: 1.0}, {}, {5: 0.1}]
    got = conditional_target(p, live_weights(allowed, known, live))
    want = conditional_target_reference(p, allowed, known, live)
    torch.testing.assert_close(got, want)
    assert torch.equal(got[1], conditional_target(p, torch.ones(r, v))[1])         # unknown: the model's own row
    assert bool((got[known] * ~allowed[known]).eq(0).all())                        # known: refused ids never
    torch.testing.assert_close(allowed_mass(p, allowed), (p * allowed).sum(-1).double())
