"""engine/trie.py and the walk it feeds (kernels/walk_book.py), on a toy model small enough to
enumerate: a 4-token vocabulary (a, b, c, stop), a fixed law per prefix, and a grammar given as its
set of complete outputs. Attempts run one token at a time exactly as the VerifierActor runs them
(WalkBook.target, then WalkBook.settle), the Trie learns from each rejection, and:
- the accepted outputs follow P(x | x in L) (chi-square against the enumeration), and the masked
  law, enumerated too, is a different law that the same test rejects;
- every L the trie holds equals the slow definition (the mass under the node not passing a
  known-refused child), and L(root) falls with every rejection, so attempts get likelier to pass;
- a full trie stops learning and stays exact.
"""
from __future__ import annotations

import functools
import itertools

import pytest
import torch

from interlock.engine.trie import Trie
from interlock.kernels.walk_book import WalkBook
from interlock.protocol.conditional import ROOT
from interlock.protocol.messages import RequestSnapshot
from interlock.protocol.sampling import SamplingParams

from chi_square import chi_square_pvalue

V, STOP = 4, 3
MAX_TOKENS = 5                      # outputs of at most 4 tokens before the stop token
L = {(0,), (1, 2), (2, 0), (2, 2)}     # P(L) ~ 0.02: plain rejection would take ~50 attempts


@functools.cache
def law(prefix: tuple[int, ...]) -> torch.Tensor:
    """The toy model's p(. | prefix): fixed, uneven, different at every prefix."""
    g = torch.Generator().manual_seed(hash(prefix) % 2**31)
    return torch.softmax(1.5 * torch.randn(V, generator=g), 0)


def allowed(prefix: tuple[int, ...]) -> torch.Tensor:
    a = torch.zeros(V, dtype=torch.bool)
    for x in L:
        if x[: len(prefix)] == prefix and len(x) > len(prefix):
            a[x[len(prefix)]] = True
    a[STOP] = prefix in L
    return a


def p_of(x: tuple[int, ...]) -> float:
    """P(x then stop) under the toy model."""
    out = 1.0
    for i, t in enumerate((*x, STOP)):
        out *= float(law(x[:i])[t])
    return out


def conditional_law() -> dict[tuple[int, ...], float]:
    total = sum(p_of(x) for x in L)
    return {x: p_of(x) / total for x in L}


def masked_law() -> dict[tuple[int, ...], float]:
    out = {}
    for x in L:
        m = 1.0
        for i, t in enumerate((*x, STOP)):
            p = law(x[:i]) * allowed(x[:i])
            m *= float(p[t] / p.sum())
        out[x] = m
    return out


def attempt(trie: Trie, gen: torch.Generator) -> tuple[int, ...] | None:
    """One attempt on the trie's snapshot: the accepted output, or None (the trie learned from it)."""
    book = WalkBook([STOP])
    s = RequestSnapshot("r", 0, 0, 0, (), True, True,
                        SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, law="conditional"), trie=trie.freeze())
    prefix: tuple[int, ...] = ()
    while True:
        p = law(prefix).unsqueeze(0)
        target, a = book.target(s, (), p, allowed(prefix).unsqueeze(0))
        t = int(torch.multinomial(target[0], 1, generator=gen))
        refused = book.settle(s, [t], p, a)
        if refused is not None:
            trie.record(refused.visits)
            return None
        if t == STOP:
            return prefix
        prefix = (*prefix, t)


def sample(max_nodes: int, seed: int) -> tuple[tuple[int, ...], int]:
    trie, gen = Trie(max_nodes), torch.Generator().manual_seed(seed)
    for n in itertools.count(1):
        out = attempt(trie, gen)
        if out is not None:
            return out, n
    raise AssertionError("unreachable")


def pvalue(samples: list[tuple[int, ...]], expected: dict[tuple[int, ...], float]) -> float:
    outcomes = sorted(expected)
    return chi_square_pvalue(torch.tensor([samples.count(o) for o in outcomes]),
                             torch.tensor([expected[o] for o in outcomes]))


def test_the_two_laws_differ() -> None:
    cond, masked = conditional_law(), masked_law()
    assert max(abs(cond[x] - masked[x]) for x in L) > 0.1, (cond, masked)


@pytest.mark.parametrize("max_nodes, draws", [(100_000, 1000), (3, 300)])
def test_accepted_attempts_sample_the_conditional_law(max_nodes: int, draws: int) -> None:
    draws = [sample(max_nodes, seed) for seed in range(draws)]
    samples = [x for x, _ in draws]
    assert pvalue(samples, conditional_law()) > 1e-3
    assert pvalue(samples, masked_law()) < 1e-6          # the test tells the two laws apart


def slow_live(trie: Trie, node: int, prefix: tuple[int, ...]) -> float:
    """L(node) by its definition: the model's mass of the complete strings under `node` (of at most
    MAX_TOKENS - 1 tokens) that pass no refused child of a known node."""
    def mass(n: int | None, pre: tuple[int, ...]) -> float:
        if n is None:
            return 1.0                                    # unknown: nothing under it is known dead
        p, a = law(pre), allowed(pre)
        if len(pre) == MAX_TOKENS - 1:
            a = a & (torch.arange(V) == STOP)
        total = 0.0
        for t in range(V):
            if not a[t]:
                continue
            child = trie.children[n].get(t)
            total += float(p[t]) * (1.0 if t == STOP else mass(child[0] if child else None, (*pre, t)))
        return total
    return mass(node, prefix)


def test_live_mass_is_the_definition_and_falls_with_every_rejection() -> None:
    trie, gen = Trie(100_000), torch.Generator().manual_seed(0)
    roots = [trie.live_mass]
    for _ in range(40):
        if attempt(trie, gen) is None:
            roots.append(trie.live_mass)
            assert trie.live_mass == pytest.approx(slow_live(trie, ROOT, ()), abs=1e-9)
    assert len(roots) > 5
    assert all(b < a for a, b in zip(roots, roots[1:])), roots
    # an attempt passes with probability P(L) / L(root): it rises as the trie learns
    assert roots[-1] < 0.5 * roots[1]


def test_attempts_fall_with_learning_and_a_full_trie_stops_learning() -> None:
    p_l = sum(p_of(x) for x in L)
    learned = [n for _, n in (sample(100_000, seed) for seed in range(300))]
    assert sum(learned) / len(learned) < 0.5 / p_l          # plain rejection would take 1 / P(L)
    trie = Trie(3)
    gen = torch.Generator().manual_seed(1)
    for _ in range(50):
        attempt(trie, gen)
    assert len(trie) == 3
