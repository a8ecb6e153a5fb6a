"""Statistical exactness across the switch: the first two tokens of stochastic requests under a
StructuralTag whose trigger is a likely first token, drafted by a model with other weights (so
drafts cross the switch and are both accepted and rejected), are distributed as the target law: free (top-k) for the
first token, then the tag's grammar mask for the second token exactly when the first was the trigger.

The law is computed outside the engine (the engine's forward is batch-invariant, so the logits it
verifies against are these). A check against the law without the switch (the second token free
after the trigger too) shows the test can tell the switch from none. The default run draws 1,000
samples; `pytest -m soak` draws 20,000. Both the composing matcher and `native=True` (the backend's
own grammar; every row applied, none skipped) are checked, each against the law its own masks give.
"""
from __future__ import annotations

import anyio
import pytest
import torch

from interlock.drafters.model import DraftLM
from interlock.engine import Engine, EngineConfig
from interlock.grammars import make_backend
from interlock.grammars.bitmask import allocate_bitmask
from interlock.kernels import apply_token_bitmask_, probs_from_logits
from interlock.models.loader import load_model
from interlock.protocol.grammar import Choice, GrammarConfig, StructuralTag, Tag
from interlock.protocol.sampling import Completion, SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from chi_square import chi_square_pvalue
from laws import logits_after
from helpers import assert_all_free, complete_all

PROMPT = "abc abc abc abc"
TOP_K, TEMPERATURE = 3, 1.0
ALPHA = 1e-3




def _probs(tiny, logits: torch.Tensor, matcher=None) -> torch.Tensor:
    row = logits[None].clone()
    row[:, tiny.tokenizer.vocab_size:] = float("-inf")
    if matcher is not None:
        mask = allocate_bitmask(1, tiny.config.vocab_size)
        matcher.fill_mask(mask, 0)
        apply_token_bitmask_(row, mask)
    return probs_from_logits(row.float(), torch.tensor([TEMPERATURE]), torch.tensor([TOP_K]), None)[0]


def _spec_and_law(tiny, backend_name: str = "llguidance", native: bool = False) -> tuple[StructuralTag, dict, dict]:
    """The spec (trigger: the most likely first token), the law of the first two tokens with the
    switch (each under the spec's own mask row), and without it."""
    tok = tiny.tokenizer
    prompt = tok.encode_prompt(PROMPT)
    first_logits = logits_after(tiny, prompt, [])[0]
    trigger = int(first_logits[: tok.vocab_size].argmax())
    marker = tok.decode([trigger])
    spec = StructuralTag([marker], [Tag(marker, Choice(["yes", "no", "maybe"]), ";")], native=native)
    backend = make_backend(backend_name, tok, tiny.config.vocab_size)
    compiled = backend.compile(spec)
    first = _probs(tiny, first_logits, backend.matcher(compiled))
    law, no_switch = {}, {}
    for t0 in first.nonzero().flatten().tolist():
        after = logits_after(tiny, prompt, [t0])[1]
        matcher = backend.matcher(compiled)
        assert matcher.accept([t0])
        switched = _probs(tiny, after, matcher)
        free = _probs(tiny, after)
        for t1 in switched.nonzero().flatten().tolist():
            law[(t0, t1)] = float(first[t0]) * float(switched[t1])
        for t1 in free.nonzero().flatten().tolist():
            no_switch[(t0, t1)] = float(first[t0]) * float(free[t1])
    assert any(t0 == trigger for t0, _ in law) and float(first[trigger]) > 0.2     # the switch is common
    return spec, law, no_switch


async def _samples(engine: Engine, spec, draws: int) -> list[Completion]:
    return await complete_all(engine, [(PROMPT, spec, SamplingParams(temperature=TEMPERATURE, top_k=TOP_K, seed=i,
                                                                     max_tokens=2)) for i in range(draws)],
                              timeout_s=3000, concurrency=8)


async def _check(tiny, draws: int, backend: str, native: bool = False) -> None:
    spec, law, no_switch = await anyio.to_thread.run_sync(_spec_and_law, tiny, backend, native)
    # A draft model with other weights: its drafts (masked draft-side by the same switch) differ
    # from the target's law, so the verifier both accepts and rejects them on each side of it.
    other = await anyio.to_thread.run_sync(lambda: load_model("tiny", seed=1))
    speculative = SpeculativeConfig(("draft", "forced"), max_draft_len=2, draft_lm=DraftLM.full(other.model))
    config = EngineConfig(speculative=speculative, max_batch_size=8, grammar=GrammarConfig(backend=backend))
    async with Engine(tiny, config) as engine:
        completions = await _samples(engine, spec, draws)
        await assert_all_free(engine)
    samples = [c.token_ids for c in completions]
    drafted, accepted = sum(c.stats.drafted for c in completions), sum(c.stats.accepted for c in completions)
    assert 0 < accepted < drafted, "drafts should be both accepted and rejected"
    assert all(len(s) == 2 for s in samples), "every sample is two tokens (no stop this early)"
    assert set(samples) <= set(law), "a token outside the switched, masked top-k support was emitted"
    outcomes = sorted(set(law) | set(no_switch))
    counts = torch.tensor([samples.count(o) for o in outcomes])
    assert chi_square_pvalue(counts, torch.tensor([law.get(o, 0.0) for o in outcomes])) > ALPHA
    # power: without the switch, most samples after the trigger would be impossible ...
    impossible = sum(no_switch.get(x, 0.0) < 1e-6 for x in samples)
    assert impossible > draws // 20
    # ... and the test refuses the right support with the wrong odds (second token uniform after the trigger)
    trigger = next(t0 for (t0, t1) in law if t1 is not None and (t0, t1) not in no_switch)
    after = [o for o in law if o[0] == trigger]
    mass = sum(law[o] for o in after)
    flat = {o: (mass / len(after) if o in after else law[o]) for o in law}
    assert chi_square_pvalue(counts, torch.tensor([flat.get(o, 0.0) for o in outcomes])) < ALPHA


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
async def test_first_tokens_after_the_switch_follow_the_masked_law(tiny, backend, native) -> None:
    await _check(tiny, 1000, backend, native)


@pytest.mark.soak
@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
async def test_first_tokens_after_the_switch_follow_the_masked_law_soak(tiny, backend, native) -> None:
    await _check(tiny, 20_000, backend, native)
