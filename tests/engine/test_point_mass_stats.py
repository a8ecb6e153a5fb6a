"""Statistical exactness through the whole engine for point-mass drafts (n-gram, grammar-forced, a
user drafter), without CFG, with top-k and with top-p: the first tokens of a constrained request,
drawn over many seeds, follow the masked target law computed directly from the model.

Each case is a chi-square test at ALPHA / len(CASES) (Bonferroni). The default run draws SHORT
samples per case; `pytest -m soak` draws SOAK (20,000) per case. Through the device runner (each
draw a request on the deferred-op timeline, the slow part of CI) the default run draws DEVICE per
case for two cases, and the soak DEVICE_SOAK for all three. Two planted bugs in the rejection
rule (the accept test reading the next position's law: off by one; the residual ignoring q, so a
rejected draft can come back) must be rejected by the same test, which shows it has power.
"""
from __future__ import annotations

from dataclasses import dataclass

import anyio
import pytest
import torch

from interlock.engine import Engine, EngineConfig
from interlock.kernels import rejection as rejection_module
from interlock.kernels.sampling import inverse_cdf
from interlock.kernels.types import RejectionResult
from interlock.protocol.grammar import JsonSchema, Regex
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from chi_square import chi_square_pvalue
from helpers import assert_all_free, wait_idle
from resources import DEVICE_CONTEXT
from laws import draw, target_law

ALPHA = 1e-3
SHORT, SOAK = 1000, 20_000
# The device runner's draws are the suite's slowest: 200 keep the planted bug's p below 1e-90 (the
# false-alarm rate is ALPHA at any count), the soak runs the rest.
DEVICE, DEVICE_SOAK = 200, 4000
WORDS = Regex(r"[a-z]{2,12}( [a-z]{1,6}){0,4}")
FEW = Regex(r"(alpha|beta|gamma|delta)( one| two| three){0,2}")    # few outcomes: an unfiltered law stays small
FIXED_KEYS = JsonSchema({"type": "object", "properties": {"abc": {"enum": [1, 2]}, "de": {"type": "boolean"}},
                         "required": ["abc", "de"], "additionalProperties": False})


class Always:
    """A user drafter that always proposes one token, k times (a point mass)."""

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, requests, k):
        return [[self.token] * k for _ in requests]


@dataclass(frozen=True)
class Case:
    speculative: SpeculativeConfig
    prompt: str
    grammar: object
    tokens: int
    temperature: float
    top_k: int | None = None
    top_p: float | None = None
    rejects: bool = True           # drafts are rejected too (forced drafts are the only allowed token: never)


Z = 106                            # the tiny model's favourite token under WORDS ("z"): p ~ 0.3 first, ~1 after it
CASES = {
    "ngram-top_k": Case(SpeculativeConfig(("ngram",), max_draft_len=3), "Once upon a time", WORDS, 3, 10.0, top_k=4),
    "ngram-top_p": Case(SpeculativeConfig(("ngram",), max_draft_len=3), "Once upon a time", WORDS, 3, 2.0,
                        top_p=0.8, rejects=False),
    "forced-top_k": Case(SpeculativeConfig(("forced",), max_draft_len=3), "JSON please", FIXED_KEYS, 3, 10.0,
                         top_k=4, rejects=False),
    "user-top_p": Case(SpeculativeConfig((), max_draft_len=3, user_drafter=Always(Z)), "Once upon a time", WORDS,
                       3, 2.0, top_p=0.8),
    "ngram-sample": Case(SpeculativeConfig(("ngram",), max_draft_len=3), "alpha one alpha one", FEW, 3, 2.0),
}


async def _draw(tiny, case: Case, draws: int, runner: str = "auto",
                metrics: list | None = None) -> tuple[list[tuple[int, ...]], int, int, dict]:
    sampling = [SamplingParams(temperature=case.temperature, top_k=case.top_k, top_p=case.top_p, seed=i,
                               max_tokens=case.tokens) for i in range(draws)]
    config = EngineConfig(speculative=case.speculative, max_batch_size=16, runner=runner, max_context=DEVICE_CONTEXT)
    async with Engine(tiny, config) as engine:
        samples, drafted, accepted = await draw(engine, case.prompt, case.grammar, sampling)
        await wait_idle(engine)
        await assert_all_free(engine)
        if metrics is not None:
            metrics.append(await engine.metrics())
        law = await anyio.to_thread.run_sync(target_law, tiny, engine, case.prompt, case.grammar, case.tokens,
                                             case.temperature, case.top_k, case.top_p)
    return samples, drafted, accepted, law


def _pvalue(samples: list[tuple[int, ...]], law: dict) -> float:
    outcomes = sorted(set(law) | set(samples))
    counts = torch.tensor([samples.count(o) for o in outcomes])
    return chi_square_pvalue(counts, torch.tensor([law.get(o, 0.0) for o in outcomes]))


async def _check(tiny, name: str, draws: int, runner: str = "auto") -> None:
    metrics: list = []
    samples, drafted, accepted, law = await _draw(tiny, CASES[name], draws, runner, metrics)
    if runner == "device":          # the law holds on captured steps too (a request's first step is eager)
        assert metrics[0].replayed_steps > 0, metrics[0]
    assert accepted > 0, f"{name}: no draft was accepted"
    assert accepted < drafted or not CASES[name].rejects, f"{name}: every one of {drafted} drafts was accepted"
    assert set(samples) <= set(law), f"{name}: an outcome the masked target law gives no mass"
    p = _pvalue(samples, law)
    assert p > ALPHA / len(CASES), f"{name}: chi-square p = {p:.2e} over {len(law)} outcomes"


@pytest.mark.parametrize("name", list(CASES))
async def test_point_mass_drafts_sample_the_masked_target_law(tiny, name: str) -> None:
    await _check(tiny, name, SHORT)


@pytest.mark.parametrize("name, draws", [("user-top_p", DEVICE), ("ngram-sample", DEVICE),
                                         *[pytest.param(n, DEVICE_SOAK, marks=pytest.mark.soak)
                                           for n in ("ngram-top_k", "user-top_p", "ngram-sample")]])
async def test_the_device_runner_samples_the_masked_target_law(tiny_float, name: str, draws: int) -> None:
    """The CUDA engine's path (kernels/verify.py over staged buffers, steps captured and replayed),
    run on the CPU under CUDA's rules: sampling mode, top-k and top-p."""
    await _check(tiny_float, name, draws, runner="device")


@pytest.mark.soak
@pytest.mark.parametrize("name", list(CASES))
async def test_point_mass_drafts_sample_the_masked_target_law_20000(tiny, name: str) -> None:
    await _check(tiny, name, SOAK)


def _planted(bug: str):
    """A loop version of the torch rejection rule with one bug planted."""

    def sample(p, d, q, n, u) -> RejectionResult:
        p, u, d = p.float(), u.float(), d.long()
        rows, k_plus_1, vocab = p.shape
        k = k_plus_1 - 1
        n_acc = torch.zeros(rows, dtype=torch.long)
        new = torch.zeros(rows, dtype=torch.long)
        for b in range(rows):
            acc, valid = 0, min(int(n[b]), k)
            while acc < valid:
                t = int(d[b, acc])
                at = min(acc + 1, k) if bug == "off_by_one" else acc
                p_t = float(p[b, at, t]) if 0 <= t < vocab else 0.0
                q_t = 1.0 if q is None else float(q[b, acc, t])
                if q_t > 0 and float(u[b, acc]) < p_t / q_t:
                    acc += 1
                else:
                    break
            w = p[b, acc].clone()
            if acc < valid and bug != "q_ignored":
                t = int(d[b, acc])
                w = (w - q[b, acc]).clamp(min=0) if q is not None else w.index_fill(0, torch.tensor([t]), 0.0)
            if float(w.sum()) <= 0:
                w = p[b, acc].clone()
            new[b] = inverse_cdf(w[None], u[b, k:])[0]
            n_acc[b] = acc
        return RejectionResult(n_acc, rejection_module._assemble(d, n_acc, new))

    return sample


@pytest.mark.parametrize("bug", ["off_by_one", "q_ignored"])
async def test_the_test_rejects_a_planted_bug(tiny, bug: str, monkeypatch) -> None:
    monkeypatch.setattr(rejection_module, "_rejection_torch", _planted(bug))
    samples, _, _, law = await _draw(tiny, CASES["user-top_p"], SHORT)
    assert _pvalue(samples, law) < ALPHA / len(CASES)


async def test_the_loop_version_without_a_bug_passes(tiny, monkeypatch) -> None:
    """The planted versions differ from a correct loop only by their bug."""
    monkeypatch.setattr(rejection_module, "_rejection_torch", _planted("none"))
    samples, _, _, law = await _draw(tiny, CASES["user-top_p"], SHORT)
    assert _pvalue(samples, law) > ALPHA / len(CASES)


async def test_the_device_runner_test_rejects_a_planted_bug(tiny_float, monkeypatch) -> None:
    """The device runner's verification goes through the same rejection rule: a planted bug shows. The
    bug is capturable tensor work (a captured step has no host reads): every position is verified
    against the next position's law."""
    rule = rejection_module._rejection_torch

    def off_by_one(p, d, q, n, u):
        return rule(torch.cat([p[:, 1:], p[:, -1:]], dim=1), d, q, n, u)

    monkeypatch.setattr(rejection_module, "_rejection_torch", off_by_one)
    samples, _, _, law = await _draw(tiny_float, CASES["user-top_p"], DEVICE, runner="device")
    assert _pvalue(samples, law) < ALPHA / len(CASES)
