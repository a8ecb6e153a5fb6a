"""kernels/draft_sample.py (a device runner's draft round for every lane at once) against the host
runner's one-row draw (kernels.sampling.draw_draft) applied lane by lane on the same uniforms: the
same token, the same q over target ids, d2t maps included; forced lanes and dead rows."""
from __future__ import annotations

import pytest
import torch

from interlock.kernels import apply_token_bitmask_
from interlock.kernels.draft_sample import sample_drafts
from interlock.kernels.sampling import draw_draft
from interlock.protocol.sampling import SamplingParams

B, V, TOK_V = 6, 96, 90


def bitmask(gen: torch.Generator) -> torch.Tensor:
    bits = (torch.rand(B, 3, 32, generator=gen) < 0.5).long() << torch.arange(32)
    packed = bits.sum(-1)
    words = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    words[4] = 0                                                    # lane 4 allows nothing
    return words


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("pruned", [False, True])
def test_each_lane_draws_what_the_one_row_draw_draws(greedy: bool, pruned: bool) -> None:
    for seed in range(10):
        gen = torch.Generator().manual_seed(seed)
        d2t = torch.randperm(V, generator=gen)[:70] if pruned else None
        vd = V if d2t is None else len(d2t)
        logits = torch.randn(B, vd, generator=gen) * 2
        rows = bitmask(gen)
        masked = torch.tensor([True, True, False, True, True, True])
        forced = torch.tensor([-1, -1, -1, 17, -1, -1])
        temp = torch.zeros(B) if greedy else torch.rand(B, generator=gen) + 0.5
        top_k = torch.tensor([0, 5, 0, 0, 0, 3])
        top_p = torch.tensor([1.0, 1.0, 0.9, 1.0, 1.0, 0.8])
        u = torch.rand(B, generator=gen)
        out = sample_drafts(logits, rows, masked, forced, temp, top_k, top_p, u, TOK_V, d2t, greedy=greedy)
        for b in range(B):
            if forced[b] >= 0:
                assert int(out.tokens[b]) == 17 and bool(out.drawn[b])
                if out.q is not None:
                    assert float(out.q[b, 17]) == 1.0 and float(out.q[b].sum()) == 1.0
                continue
            x = logits[b: b + 1].clone()
            if masked[b]:
                apply_token_bitmask_(x, rows[b: b + 1], d2t=d2t, mask_vocab_size=TOK_V, backend="reference")
            params = SamplingParams(temperature=float(temp[b]), top_k=int(top_k[b]) or None,
                                    top_p=float(top_p[b]) if top_p[b] < 1 else None, seed=1)
            fixed = torch.Generator()
            fixed.manual_seed(0)
            draws = iter([u[b: b + 1]])
            with pytest.MonkeyPatch.context() as mp:       # the one-row draw takes its uniform from ours
                mp.setattr(torch, "rand", lambda *a, **k: next(draws))
                token, q = draw_draft(x[0], params, fixed, TOK_V, d2t)
            if token is None:
                assert not bool(out.drawn[b])
                continue
            assert bool(out.drawn[b]) and int(out.tokens[b]) == token, (seed, b)
            if out.q is not None and q is not None:
                assert torch.allclose(out.q[b], q, atol=1e-6), (seed, b)
