"""Rejection sampling: vectorized against the looping reference on the same uniforms, greedy rules."""
from __future__ import annotations

import pytest
import torch

from interlock.kernels.rejection import rejection_sample, rejection_sample_greedy
from interlock.kernels.sampling import draw_uniforms, sample_from_probs


def _case(n_rows: int, k: int, vocab: int, gen: torch.Generator, masked: float = 0.4):
    """Masked target probs, draft probs, drafts drawn from the drafts' own law, ragged n."""
    logits = torch.randn(n_rows, k + 1, vocab, generator=gen) * 2
    logits[torch.rand(n_rows, k + 1, vocab, generator=gen) < masked] = float("-inf")
    logits[..., 0] = 0.0  # keep one allowed id per row
    p = torch.softmax(logits, -1)
    q = torch.softmax(torch.randn(n_rows, k, vocab, generator=gen) * 2, -1)  # also on masked ids
    drafts = sample_from_probs(q.reshape(-1, vocab), torch.rand(n_rows * k, generator=gen)).view(n_rows, k)
    n = torch.randint(0, k + 1, (n_rows,), generator=gen)
    drafts = torch.where(torch.arange(k) < n.unsqueeze(1), drafts, -1)  # pad past n
    return p, q, drafts, n, torch.rand(n_rows, k + 1, generator=gen)


@pytest.mark.parametrize("point_mass", [False, True])
@pytest.mark.parametrize("k,vocab", [(1, 8), (3, 33), (5, 1000)])
def test_vectorized_matches_reference(point_mass: bool, k: int, vocab: int, gen: torch.Generator) -> None:
    p, q, drafts, n, u = _case(200, k, vocab, gen)
    if point_mass:
        # An n-gram drafter proposes ids without a law; take some straight from p's argmax.
        drafts = torch.where(torch.rand(drafts.shape, generator=gen) < 0.5, p[:, :k].argmax(-1), drafts)
        drafts = torch.where(torch.arange(k) < n.unsqueeze(1), drafts, -1)
    q_in = None if point_mass else q
    fast = rejection_sample(p, drafts, q_in, n, u, backend="torch")
    ref = rejection_sample(p, drafts, q_in, n, u, backend="reference")
    assert torch.equal(fast.num_accepted, ref.num_accepted)
    assert torch.equal(fast.tokens, ref.tokens)
    assert bool((fast.num_accepted <= n).all()) and int(fast.num_accepted.sum()) > 0
    emitted = fast.tokens >= 0
    assert torch.equal(emitted.sum(1), fast.num_accepted + 1)
    p_emitted = p.gather(2, fast.tokens.clamp(min=0).unsqueeze(2)).squeeze(2)
    assert bool((p_emitted[emitted] > 0).all())  # masked ids (p = 0) are never emitted


def test_out_of_vocab_drafts_are_rejected(gen: torch.Generator) -> None:
    p, q, _, _, u = _case(50, 2, 16, gen)
    drafts = torch.full((50, 2), 99)
    n = torch.full((50,), 2)
    for q_in in (None, q):
        fast = rejection_sample(p, drafts, q_in, n, u)
        ref = rejection_sample(p, drafts, q_in, n, u, backend="reference")
        assert bool((fast.num_accepted == 0).all()) and torch.equal(fast.tokens, ref.tokens)


def test_identical_draft_and_target_accepts_everything(gen: torch.Generator) -> None:
    p, _, _, _, u = _case(100, 3, 20, gen)
    drafts = sample_from_probs(p[:, :3].reshape(-1, 20), torch.rand(300, generator=gen)).view(100, 3)
    out = rejection_sample(p, drafts, p[:, :3].clone(), torch.full((100,), 3), u)
    assert bool((out.num_accepted == 3).all())
    assert torch.equal(out.tokens[:, :3], drafts)


@pytest.mark.parametrize("k,vocab", [(1, 5), (4, 50), (5, 1000)])
def test_greedy_matches_reference_and_definition(k: int, vocab: int, gen: torch.Generator) -> None:
    logits = torch.randn(100, k + 1, vocab, generator=gen)
    best = logits.argmax(-1)
    # Drafts that agree with the argmax for a random prefix, then disagree.
    agree = torch.randint(0, k + 1, (100, 1), generator=gen)
    drafts = torch.where(torch.arange(k) < agree, best[:, :k], (best[:, :k] + 1) % vocab)
    n = torch.randint(0, k + 1, (100,), generator=gen)
    fast = rejection_sample_greedy(logits, drafts, n, backend="torch")
    ref = rejection_sample_greedy(logits, drafts, n, backend="reference")
    assert torch.equal(fast.tokens, ref.tokens) and torch.equal(fast.num_accepted, ref.num_accepted)
    assert torch.equal(fast.num_accepted, torch.minimum(agree.squeeze(1), n))
    emitted = fast.tokens >= 0
    assert torch.equal(fast.tokens[emitted], best[emitted])  # every emitted token is an argmax


def test_one_hot_target_makes_the_stochastic_rule_greedy(gen: torch.Generator) -> None:
    # A temperature-0 row has a one-hot p; the stochastic kernel must then reproduce greedy.
    k, vocab = 4, 30
    logits = torch.randn(300, k + 1, vocab, generator=gen)
    best = logits.argmax(-1)
    one_hot = torch.zeros_like(logits).scatter_(2, best.unsqueeze(2), 1.0)
    agree = torch.randint(0, k + 1, (300, 1), generator=gen)
    drafts = torch.where(torch.arange(k) < agree, best[:, :k], (best[:, :k] + 3) % vocab)
    n = torch.randint(0, k + 1, (300,), generator=gen)
    q = torch.softmax(torch.randn(300, k, vocab, generator=gen), -1)
    greedy = rejection_sample_greedy(logits, drafts, n)
    for q_in in (None, q):
        out = rejection_sample(one_hot, drafts, q_in, n, torch.rand(300, k + 1, generator=gen))
        assert torch.equal(out.tokens, greedy.tokens)


def test_no_draft_slots_is_plain_sampling(gen: torch.Generator) -> None:
    p = torch.softmax(torch.randn(64, 1, 10, generator=gen), -1)
    u = torch.rand(64, 1, generator=gen)
    out = rejection_sample(p, torch.zeros(64, 0, dtype=torch.long), None, torch.zeros(64, dtype=torch.long), u)
    assert torch.equal(out.tokens[:, 0], sample_from_probs(p[:, 0], u[:, 0]))
    assert bool((out.num_accepted == 0).all())


def test_same_seed_same_output_whatever_the_batch(gen: torch.Generator) -> None:
    p, q, drafts, n, _ = _case(6, 3, 40, gen)

    def run(order: list[int]) -> dict[int, list[list[int]]]:
        generators = [torch.Generator().manual_seed(100 + r) for r in order]  # request r owns seed 100 + r
        seen: dict[int, list[list[int]]] = {r: [] for r in order}
        for _ in range(4):
            u = draw_uniforms(generators, 4)
            out = rejection_sample(p[order], drafts[order], q[order], n[order], u)
            for row, r in enumerate(order):
                seen[r].append(out.tokens[row].tolist())
        return seen

    full = run([0, 1, 2, 3, 4, 5])
    assert run([4, 2]) == {4: full[4], 2: full[2]}
    assert run([5, 3, 1, 0]) == {r: full[r] for r in (5, 3, 1, 0)}


def test_dispatcher_raises_value_error() -> None:
    p = torch.full((2, 3, 4), 0.25)
    d, n, u = torch.zeros(2, 2, dtype=torch.long), torch.ones(2, dtype=torch.long), torch.rand(2, 3)
    bad_calls = [
        lambda: rejection_sample(p, d, None, n, u, backend="nope"),
        lambda: rejection_sample(p, d, None, n, u, backend="cuda"),
        lambda: rejection_sample(p.double(), d, None, n, u),
        lambda: rejection_sample(p, d.float(), None, n, u),
        lambda: rejection_sample(p, d, None, n.float(), u),
        lambda: rejection_sample(p, d, None, n, u[:, :2]),
        lambda: rejection_sample(p, d, torch.rand(2, 3, 4), n, u),
        lambda: rejection_sample(p, d, None, n, u.to("meta")),
        lambda: rejection_sample_greedy(p, d[:, :1], n),
        lambda: rejection_sample_greedy(p, d, n, backend="triton"),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()
