"""kernels/verify.py (the device runner's whole verification) against a slow loop over requests that
applies the rules one by one: padded ids never, a grammar row (the request's lane's) only where filled and not free, drafts
past the grammar's rows moot, greedy = masked argmax, sampling = the rejection rule on the same
uniforms (the reference backend, request by request)."""
from __future__ import annotations

import pytest
import torch

from interlock.kernels import apply_token_bitmask_, probs_from_logits, rejection_sample
from interlock.kernels.verify import MaskInputs, VerifyInputs, verify_greedy, verify_step

B, K, V, TOK_V = 5, 3, 70, 64


def inputs(gen: torch.Generator, greedy: bool, filtered: bool = False):
    logits = torch.randn(B * (K + 1), V, generator=gen) * 3   # request b's verify rows: b*(K+1)+j
    best = logits.view(B, K + 1, V).argmax(-1)              # drafts that are often right, sometimes not
    drafts = torch.where(torch.rand(B, K, generator=gen) < 0.7, best[:, :K], torch.randint(V, (B, K), generator=gen))
    v = VerifyInputs(drafts=drafts, num_drafts=torch.randint(0, K + 1, (B,), generator=gen),
                     constrained=torch.tensor([1, 1, 0, 1, 0]).bool(),
                     temperature=torch.zeros(B) if greedy else torch.rand(B, generator=gen) + 0.5,
                     top_k=torch.tensor([0, 5, 0, 3, 0]) if filtered else torch.zeros(B, dtype=torch.long),
                     top_p=torch.tensor([1.0, 0.9, 0.8, 1.0, 1.0]) if filtered else torch.ones(B),
                     uniforms=torch.rand(B, K + 1, generator=gen))
    bits = (torch.rand(B * (K + 1), 3, 32, generator=gen) < 0.6).long() << torch.arange(32)
    packed = bits.sum(-1)
    m = MaskInputs(bitmask=torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32),
                   rows_filled=torch.randint(1, K + 2, (B,), generator=gen, dtype=torch.int32),
                   free=torch.rand(B * (K + 1), generator=gen) < 0.2)
    return logits, v, m


def masked(logits, v: VerifyInputs, m: MaskInputs, b: int) -> torch.Tensor:
    """Request b's verify rows [K+1, V], each masked by the rules one by one."""
    x = logits[b * (K + 1): (b + 1) * (K + 1)].clone()
    x[:, TOK_V:] = float("-inf")
    for j in range(K + 1):
        row = b * (K + 1) + j
        if bool(v.constrained[b]) and j < int(m.rows_filled[b]) and not bool(m.free[row]):
            apply_token_bitmask_(x[j: j + 1], m.bitmask[row: row + 1], backend="reference")
    return x


def slow(logits, v: VerifyInputs, m: MaskInputs, mode: str):
    tokens, accepted, peaks = [], [], []
    for b in range(B):
        x = masked(logits, v, m, b)                         # [K+1, V]
        filled = int(m.rows_filled[b])
        n = int(v.num_drafts[b])
        valid = min(n, filled - 1) if bool(v.constrained[b]) else n
        d = v.drafts[b]
        if mode == "greedy":
            a = 0
            while a < valid and int(x[a].argmax()) == int(d[a]):
                a += 1
            out = [int(t) for t in d[:a]] + [int(x[a].argmax())]
        else:
            f = mode == "filtered"
            p = probs_from_logits(x, v.temperature[b].repeat(K + 1), v.top_k[b].repeat(K + 1) if f else None,
                                  v.top_p[b].repeat(K + 1) if f else None)
            r = rejection_sample(p[None], d[None], None, torch.tensor([valid]), v.uniforms[b][None],
                                 backend="reference")
            a = int(r.num_accepted[0])
            out = r.tokens[0, : a + 1].tolist()
        tokens.append(out)
        accepted.append(a)
        peaks.append(x.amax(-1))
    return tokens, accepted, torch.stack(peaks)


@pytest.mark.parametrize("mode", ["greedy", "sample", "filtered"])
def test_verify_step_is_the_slow_loop(mode: str) -> None:
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        logits, v, m = inputs(gen, mode == "greedy", mode == "filtered")
        out = verify_step(logits.clone(), v, m, TOK_V, mode)  # type: ignore[arg-type]
        tokens, accepted, peaks = slow(logits, v, m, mode)
        assert out.accepted.tolist() == accepted, seed
        assert [out.tokens[b, : accepted[b] + 1].tolist() for b in range(B)] == tokens, seed
        assert torch.equal(out.peaks, peaks), seed


def test_verify_greedy_from_a_found_argmax_is_the_slow_loop() -> None:
    # The host's native pass hands verify_greedy each row's masked argmax and peak: from those
    # alone it decides what verify_step's greedy mode decides from the logits.
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        logits, v, m = inputs(gen, greedy=True)
        x = torch.stack([masked(logits, v, m, b) for b in range(B)])       # [B, K+1, V]
        out = verify_greedy(x.argmax(-1), x.amax(-1), v.drafts, v.num_drafts, v.constrained, m.rows_filled)
        tokens, accepted, peaks = slow(logits, v, m, "greedy")
        step = verify_step(logits.clone(), v, m, TOK_V, "greedy")
        assert out.accepted.tolist() == accepted, seed
        assert [out.tokens[b, : accepted[b] + 1].tolist() for b in range(B)] == tokens, seed
        assert torch.equal(out.tokens, step.tokens) and torch.equal(out.valid_drafts, step.valid_drafts), seed
        assert torch.equal(out.peaks, peaks), seed
