"""Statistical exactness of rejection sampling: its output is distributed as the masked target.

Each case builds a small vocabulary, grammar masks, target logits processed by temperature
/ top-k / top-p, and a draft law; it runs DRAWS rows through the vectorized kernel in one
call and compares, by chi-square, (a) the token emitted at each position with the masked
target's probabilities there and (b) the number of accepted drafts with its analytic law:
the target rows here do not depend on the prefix, so position j accepts with probability
alpha_j = sum_x min(p_j(x), q_j(x)) (probabilistic drafts) or sum_x r_j(x) p_j(x) (point-mass
drafts d_j ~ r_j), independently, and P(A = m) = alpha_0..alpha_{m-1} * (1 - alpha_m), with
m = n meaning every valid draft was taken. The expected laws come from the looping
reference kernels; the draws from torch.multinomial and torch.rand, not from our sampler.
Every p-value must exceed 1e-3 / (number of chi-square tests in this file) (Bonferroni).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from interlock.kernels.bitmask import apply_token_bitmask_
from interlock.kernels.rejection import rejection_sample
from interlock.kernels.sampling import probs_from_logits, sample

from chi_square import chi_square_pvalue

DRAWS = 50_000
MIN_ROWS = 2_000  # positions reached by fewer rows are not tested (counted in the budget anyway)


@dataclass(frozen=True)
class Case:
    vocab: int
    k: int
    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    point_mass: bool = False
    draft_masked: bool = False  # the drafter saw the grammar mask too
    ragged: bool = False  # rows have 0..K valid drafts


CASES = [
    Case(8, 1, 1.0),
    Case(8, 1, 1.0, point_mass=True),
    Case(16, 3, 0.7, draft_masked=True),
    Case(16, 3, 0.7, point_mass=True),
    Case(32, 2, 1.0, top_k=5),
    Case(32, 2, 0.7, top_p=0.8, point_mass=True),
    Case(24, 2, 1.0, top_k=3, point_mass=True, draft_masked=True),
    Case(48, 3, 0.7, top_p=0.5, draft_masked=True),
    Case(64, 4, 1.0, top_k=20, top_p=0.9, ragged=True),
    Case(64, 4, 0.7, point_mass=True, ragged=True),
]
# per case: K+1 token positions + K accepted-count laws; plus one plain-sampling check per case
N_TESTS = 2 * sum(2 * c.k + 1 for c in CASES) + len(CASES)   # x2: the torch and the CUDA kernel
ALPHA = 1e-3 / N_TESTS


def _setup(case: Case, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(p fast [K+1, V], p reference [K+1, V], draft law r [K, V], grammar-allowed [K+1, V])."""
    k, vocab = case.k, case.vocab
    words = (vocab + 31) // 32
    bits = torch.rand(k + 1, words * 32, generator=gen) < 0.6
    bits[:, :3] = True  # at least three allowed ids per position
    packed = (bits.view(k + 1, words, 32).long() << torch.arange(32)).sum(-1)
    bitmask = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    logits = torch.randn(k + 1, vocab, generator=gen) * 2
    apply_token_bitmask_(logits, bitmask)
    rows = k + 1
    params = (torch.full((rows,), case.temperature), torch.full((rows,), case.top_k), torch.full((rows,), case.top_p))
    p = probs_from_logits(logits, *params)
    p_ref = probs_from_logits(logits, *params, backend="reference").double()
    # A useful drafter: close to the target where the grammar allows, guessing where it does not.
    noise = torch.randn(k, vocab, generator=gen)
    draft_logits = torch.where(logits[:k] > float("-inf"), logits[:k] / case.temperature + noise, noise)
    if case.draft_masked:
        draft_logits = draft_logits.masked_fill(logits[:k] == float("-inf"), float("-inf"))
    return p, p_ref, torch.softmax(draft_logits, -1), logits > float("-inf")


def _accept_law(case: Case, p_ref: torch.Tensor, r: torch.Tensor, n: int) -> torch.Tensor:
    """P(A = m) for m = 0..n when n drafts are valid."""
    r = r.double()
    alpha = (r * p_ref[: case.k]).sum(-1) if case.point_mass else torch.minimum(r, p_ref[: case.k]).sum(-1)
    law, reach = [], 1.0
    for m in range(n):
        law.append(reach * (1 - float(alpha[m])))
        reach *= float(alpha[m])
    law.append(reach)
    return torch.tensor(law, dtype=torch.float64)


def _run(case: Case, p: torch.Tensor, r: torch.Tensor, drafts_from: torch.Tensor, gen: torch.Generator,
         backend: str = "torch"):
    k, vocab = case.k, case.vocab
    drafts = torch.multinomial(drafts_from, DRAWS, replacement=True, generator=gen).T.contiguous()  # [N, K]
    if case.ragged:
        n = torch.randint(0, k + 1, (DRAWS,), generator=gen)
    else:
        n = torch.full((DRAWS,), k)
    u = torch.rand(DRAWS, k + 1, generator=gen)
    q = None if case.point_mass else r.expand(DRAWS, k, vocab)
    if backend == "cuda":  # the Triton kernel on the same inputs; results come back to the CPU
        q = None if q is None else q.cuda()
        out = rejection_sample(p.expand(DRAWS, k + 1, vocab).cuda(), drafts.cuda(), q, n.cuda(), u.cuda(),
                               backend="cuda")
        return type(out)(out.num_accepted.cpu(), out.tokens.cpu()), n
    return rejection_sample(p.expand(DRAWS, k + 1, vocab), drafts, q, n, u), n


def _pvalues(case: Case, p_ref: torch.Tensor, r: torch.Tensor, out, n: torch.Tensor) -> list[float]:
    pvalues: list[float] = []
    for j in range(case.k + 1):  # the token at position j, over the rows that reach j
        reached = out.num_accepted >= j
        if int(reached.sum()) >= MIN_ROWS:
            counts = torch.bincount(out.tokens[reached, j], minlength=case.vocab)
            pvalues.append(chi_square_pvalue(counts, p_ref[j]))
    for valid in range(1, case.k + 1):  # the accepted count, per number of valid drafts
        rows = n == valid
        if int(rows.sum()) >= MIN_ROWS:
            counts = torch.bincount(out.num_accepted[rows], minlength=valid + 1)
            pvalues.append(chi_square_pvalue(counts, _accept_law(case, p_ref, r, valid)))
    return pvalues


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"V{c.vocab}-K{c.k}-T{c.temperature}-k{c.top_k}-p{c.top_p}"
                         f"-{'point' if c.point_mass else 'probs'}{'-dmask' if c.draft_masked else ''}"
                         f"{'-ragged' if c.ragged else ''}")
@pytest.mark.parametrize("backend", ["torch", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_output_is_distributed_as_the_masked_target(case: Case, backend: str) -> None:
    gen = torch.Generator().manual_seed(1000 + CASES.index(case))
    p, p_ref, r, grammar_allowed = _setup(case, gen)
    out, n = _run(case, p, r, r, gen, backend)
    emitted = out.tokens >= 0
    positions = torch.arange(case.k + 1).expand(DRAWS, -1)[emitted]
    tokens = out.tokens[emitted]
    assert bool(grammar_allowed[positions, tokens].all()), "a grammar-masked token was emitted"
    assert bool((p_ref[positions, tokens] > 0).all()), "a token outside top-k/top-p was emitted"
    pvalues = _pvalues(case, p_ref, r, out, n)
    assert len(pvalues) >= 3  # at least the first token, a later position and one accepted-count law
    assert min(pvalues) > ALPHA, f"p-values {pvalues} (threshold {ALPHA:.2e})"


@pytest.mark.parametrize("case", CASES[::3], ids=lambda c: f"V{c.vocab}-T{c.temperature}-k{c.top_k}-p{c.top_p}")
def test_plain_sampling_is_distributed_as_the_masked_target(case: Case) -> None:
    # The non-speculative path (sample on masked logits) against the reference law.
    gen = torch.Generator().manual_seed(2000 + CASES.index(case))
    grammar_allowed = _setup(case, gen)[3]
    logits = torch.where(grammar_allowed[0], torch.randn(case.vocab, generator=gen) * 2, float("-inf"))
    rows = (DRAWS,)
    tokens = sample(logits.expand(DRAWS, case.vocab), torch.full(rows, case.temperature),
                    torch.full(rows, case.top_k), torch.full(rows, case.top_p), torch.rand(DRAWS, generator=gen))
    law = probs_from_logits(logits.unsqueeze(0), torch.tensor([case.temperature]), torch.tensor([case.top_k]),
                            torch.tensor([case.top_p]), backend="reference")[0]
    counts = torch.bincount(tokens, minlength=case.vocab)
    assert int(counts[law == 0].sum()) == 0
    assert chi_square_pvalue(counts, law) > ALPHA


def test_the_chi_square_check_catches_a_wrong_draft_law() -> None:
    # Drafts drawn from one law but declared with another break exactness; the test must see it.
    case = Case(16, 2, 1.0)
    gen = torch.Generator().manual_seed(7)
    p, p_ref, r, _ = _setup(case, gen)
    actual = torch.softmax(torch.randn(case.k, case.vocab, generator=gen) * 3, -1)
    out, n = _run(case, p, r, actual, gen)
    assert min(_pvalues(case, p_ref, r, out, n)) < ALPHA


def test_chi_square_pvalue_is_calibrated() -> None:
    # Known values of the chi-square survival function: df = 2 gives exp(-x / 2).
    observed = torch.tensor([60, 40, 100])
    expected = torch.tensor([0.25, 0.25, 0.5])
    assert math.isclose(chi_square_pvalue(observed, expected), math.exp(-4.0 / 2), rel_tol=1e-9)
    assert chi_square_pvalue(torch.tensor([50, 50, 100]), expected) == pytest.approx(1.0)
