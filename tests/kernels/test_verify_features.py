"""kernels/verify_features.py (guidance, penalties and logprobs around the device runner's
verification) against a slow loop over lanes that applies each feature to one request at a time:
its companion's rows combined at its own scale (scale 1: its rows untouched), its penalty row's
counts plus the drafts before each position, the padded-id and grammar masks, verification
(verify_step, which tests/kernels/test_verify.py checks against its own slow loop), the emitted
tokens added to its counts, and the log-probabilities of the reference kernel on its masked rows."""
from __future__ import annotations

import pytest
import torch

from interlock.kernels import apply_token_bitmask_, cfg_combine
from interlock.kernels.logprobs_reference import token_logprobs_reference
from interlock.kernels.penalties import apply_penalties
from interlock.kernels.penalties_reference import draft_counts_reference
from interlock.kernels.verify import MaskInputs, VerifyInputs, verify_step
from interlock.kernels.verify_features import (
    Features, GuideInputs, PenaltyCounts, PenaltyInputs, count_tokens_, verify_features,
)

B, K, V, TOK_V, P, N = 5, 3, 70, 64, 4, 4
K1 = K + 1
GUIDED = {1: (1, 2.5), 3: (0, 1.0), 4: (1, -0.5)}        # lane: (companion, scale); companion 1 guides two lanes
PENALIZED = {0: 2, 3: 0}                                  # lane: penalty row
PARAMS = {0: (0.5, 1.5, 1.3), 3: (-0.6, -0.3, 0.8)}       # lane: presence, frequency, repetition


def inputs(gen: torch.Generator, mode: str):
    g = 2                                                   # companions
    logits = torch.randn((B + g) * K1, V, generator=gen) * 3
    best = logits[: B * K1].view(B, K1, V).argmax(-1)
    drafts = torch.where(torch.rand(B, K, generator=gen) < 0.7, best[:, :K], torch.randint(V, (B, K), generator=gen))
    v = VerifyInputs(drafts=drafts, num_drafts=torch.randint(0, K + 1, (B,), generator=gen),
                     constrained=torch.tensor([1, 1, 0, 1, 0]).bool(),
                     temperature=torch.zeros(B) if mode == "greedy" else torch.rand(B, generator=gen) + 0.5,
                     top_k=torch.tensor([0, 5, 0, 3, 0]), top_p=torch.tensor([1.0, 0.9, 0.8, 1.0, 1.0]),
                     uniforms=torch.rand(B, K1, generator=gen))
    bits = (torch.rand(B * K1, 3, 32, generator=gen) < 0.6).long() << torch.arange(32)
    packed = bits.sum(-1)
    m = MaskInputs(bitmask=torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32),
                   rows_filled=torch.randint(1, K + 2, (B,), generator=gen, dtype=torch.int32),
                   free=torch.rand(B * K1, generator=gen) < 0.2)
    guide = GuideInputs(torch.tensor([GUIDED.get(b, (0, 1.0))[0] for b in range(B)]),
                        torch.tensor([GUIDED.get(b, (0, 1.0))[1] for b in range(B)]))
    rows = torch.tensor([PENALIZED.get(b, P) for b in range(B)])
    param = [PARAMS.get(b, (0.0, 0.0, 1.0)) for b in range(B)]
    pen = PenaltyInputs(rows, rows < P, *(torch.tensor([p[i] for p in param]) for i in range(3)))
    counts = PenaltyCounts(torch.randint(0, 3, (P + 1, V), generator=gen, dtype=torch.int32),
                           torch.rand(P + 1, V, generator=gen) < 0.1)
    counts.counts[P] = 0                                   # the zero row
    counts.prompt[P] = False
    return logits, v, m, guide, pen, counts


def slow(logits, v: VerifyInputs, m: MaskInputs, guide: GuideInputs | None, pen: PenaltyInputs | None,
         counts: PenaltyCounts | None, mode: str, n: int | None):
    """(verification's output on the slowly prepared rows, the counts after it, the logprobs)."""
    rows = []
    for b in range(B):
        x = logits[b * K1: (b + 1) * K1].clone()                               # [K1, V]
        if guide is not None and float(guide.scale[b]) != 1.0:
            g = int(guide.companion[b])
            u = logits[(B + g) * K1: (B + g + 1) * K1]
            x = cfg_combine(x, u, guide.scale[b].repeat(K1))
        if pen is not None and bool(pen.penalized[b]):
            n_valid = int(v.num_drafts[b]) if not bool(v.constrained[b]) else \
                min(int(v.num_drafts[b]), int(m.rows_filled[b]) - 1)
            c = draft_counts_reference(counts.counts[int(pen.row[b])][None], v.drafts[b][None],
                                       torch.tensor([n_valid]))[0]              # [K1, V]
            x = apply_penalties(x, c, counts.prompt[int(pen.row[b])].expand(K1, V), pen.presence[b].repeat(K1),
                                pen.frequency[b].repeat(K1), pen.repetition[b].repeat(K1))
        rows.append(x)
    prepared = torch.cat(rows)
    out = verify_step(prepared.clone(), v, m, TOK_V, mode)  # type: ignore[arg-type]
    after = None
    if counts is not None and pen is not None:
        after = counts.counts.clone()
        for b in range(B):
            if bool(pen.penalized[b]):
                for t in out.tokens[b, : int(out.accepted[b]) + 1].tolist():
                    after[int(pen.row[b]), t] += 1
    lp = []
    if n is not None:
        for b in range(B):
            x = prepared[b * K1: (b + 1) * K1].clone()
            x[:, TOK_V:] = float("-inf")
            for j in range(K1):
                row = b * K1 + j
                if bool(v.constrained[b]) and j < int(m.rows_filled[b]) and not bool(m.free[row]):
                    apply_token_bitmask_(x[j: j + 1], m.bitmask[row: row + 1], backend="reference")
            used = int(out.accepted[b]) + 1
            f = mode == "filtered"
            lp.append(token_logprobs_reference(x[:used], out.tokens[b, :used], v.temperature[b].repeat(used),
                                               v.top_k[b].repeat(used) if f else None,
                                               v.top_p[b].repeat(used) if f else None, n))
    return out, after, lp


FEATURES = ["guide", "penalties", "logprobs", "all"]


@pytest.mark.parametrize("mode", ["greedy", "sample", "filtered"])
@pytest.mark.parametrize("which", FEATURES)
def test_verify_features_is_the_slow_loop(mode: str, which: str) -> None:
    for seed in range(8):
        gen = torch.Generator().manual_seed(seed)
        logits, v, m, guide, pen, counts = inputs(gen, mode)
        use = {which} if which != "all" else set(FEATURES)
        if "guide" not in use:
            logits = logits[: B * K1]
        f = Features(guide if "guide" in use else None,
                     (pen, counts) if "penalties" in use else None,
                     N if "logprobs" in use else None)
        want, after, lp = slow(logits, v, m, f.guide, pen if f.penalties else None, counts if f.penalties else None,
                               mode, f.logprobs)
        got, got_lp = verify_features(logits.clone(), v, m, TOK_V, mode, f)  # type: ignore[arg-type]
        assert torch.equal(got.tokens, want.tokens) and torch.equal(got.accepted, want.accepted), seed
        assert torch.equal(got.valid_drafts, want.valid_drafts) and torch.equal(got.peaks, want.peaks), seed
        if after is not None:
            assert torch.equal(counts.counts, after), seed
        assert (got_lp is None) == (f.logprobs is None)
        for b, ref in enumerate(lp):
            used = int(want.accepted[b]) + 1
            torch.testing.assert_close(got_lp.token[b, :used], ref.token, rtol=1e-4, atol=1e-5)
            finite = ref.top > float("-inf")                                   # ties among -inf: any order
            assert torch.equal(got_lp.top_ids[b, :used][finite], ref.top_ids[finite]), seed
            torch.testing.assert_close(got_lp.top[b, :used][finite], ref.top[finite], rtol=1e-4, atol=1e-5)


def test_features_change_the_rows_they_should() -> None:
    """The loop above would pass for features that did nothing if they did nothing there too: a
    guided lane at scale != 1 and a penalized lane must differ from the plain verification."""
    gen = torch.Generator().manual_seed(0)
    logits, v, m, guide, pen, counts = inputs(gen, "greedy")
    plain = verify_step(logits[: B * K1].clone(), v, m, TOK_V, "greedy")
    guided, _ = verify_features(logits.clone(), v, m, TOK_V, "greedy", Features(guide=guide))
    penalized, _ = verify_features(logits[: B * K1].clone(), v, m, TOK_V, "greedy", Features(penalties=(pen, counts)))
    assert not torch.equal(guided.peaks[1], plain.peaks[1]) and not torch.equal(guided.peaks[4], plain.peaks[4])
    assert torch.equal(guided.peaks[3], plain.peaks[3])        # scale 1: bit for bit
    assert not torch.equal(penalized.peaks[0], plain.peaks[0])
    for b in (1, 2, 4):                                        # unpenalized lanes: bit for bit
        assert torch.equal(penalized.peaks[b], plain.peaks[b])


def test_counting_adds_emitted_tokens_of_penalized_lanes_only() -> None:
    counts = PenaltyCounts.allocate(2, 6, torch.device("cpu"))
    pen = PenaltyInputs(torch.tensor([1, 2, 0]), torch.tensor([True, False, True]), *(torch.zeros(3),) * 3)
    count_tokens_(counts, pen, torch.tensor([[4, 4, -1], [1, 2, 3], [5, -1, -1]]))
    want = torch.zeros(3, 6, dtype=torch.int32)
    want[1, 4], want[0, 5] = 2, 1
    assert torch.equal(counts.counts, want)                   # the zero row (2) stays zero
