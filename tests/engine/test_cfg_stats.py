"""Statistical exactness of classifier-free guidance with speculation: the first two tokens of
stochastic CFG requests, drafted by a model that sees only the conditional prompt (so drafts are
accepted and rejected), are distributed as the guided, grammar-masked, top-k target.

The expected law is computed outside the engine (laws.first_two_law): the tiny model's cond and
uncond logits after the prompts (and after each first token), cfg_combine, the grammar's masks
from a fresh matcher, probs_from_logits. The engine's forward is batch-invariant, so the logits it
verifies against are these. A check against the unguided law shows the test can tell guidance
from none.
"""
from __future__ import annotations

import anyio
import torch

from interlock.drafters.model import DraftLM
from interlock.engine import Engine, EngineConfig
from interlock.protocol.grammar import Regex
from interlock.protocol.sampling import Completion, SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from chi_square import chi_square_pvalue
from laws import first_two_law
from helpers import assert_all_free, complete_all

PROMPT = "Once upon a time"
GRAMMAR = Regex(r"[a-z]{3,9}( [a-z]{2,5}){0,3}")
SCALE, TOP_K, TEMPERATURE = 2.5, 3, 1.0
DRAWS = 1000
ALPHA = 1e-3




async def _samples(engine: Engine) -> list[Completion]:
    return await complete_all(engine, [(PROMPT, GRAMMAR, SamplingParams(
        temperature=TEMPERATURE, top_k=TOP_K, guidance_scale=SCALE, seed=i, max_tokens=2)) for i in range(DRAWS)],
        timeout_s=300, concurrency=8)


async def test_stochastic_cfg_with_speculation_samples_the_guided_masked_law(tiny) -> None:
    speculative = SpeculativeConfig(("draft",), max_draft_len=2, draft_lm=DraftLM.full(tiny.model))
    async with Engine(tiny, EngineConfig(speculative=speculative, max_batch_size=8)) as engine:
        completions = await _samples(engine)
        await assert_all_free(engine)
        guided = await anyio.to_thread.run_sync(lambda: first_two_law(tiny, engine, PROMPT, GRAMMAR,
                                                                      temperature=TEMPERATURE, top_k=TOP_K,
                                                                      scale=SCALE))
        unguided = await anyio.to_thread.run_sync(lambda: first_two_law(tiny, engine, PROMPT, GRAMMAR,
                                                                        temperature=TEMPERATURE, top_k=TOP_K))
    samples = [c.token_ids for c in completions]
    drafted, accepted = sum(c.stats.drafted for c in completions), sum(c.stats.accepted for c in completions)
    assert 0 < accepted < drafted, "drafts should be both accepted and rejected"
    outcomes = sorted(set(guided) | set(unguided))
    assert all(len(s) == 2 for s in samples), "every sample is two tokens (no stop this early)"
    assert set(samples) <= set(guided), "a token outside the guided, masked top-k support was emitted"
    counts = torch.tensor([samples.count(o) for o in outcomes])
    p_guided = chi_square_pvalue(counts, torch.tensor([guided.get(o, 0.0) for o in outcomes]))
    p_unguided = chi_square_pvalue(counts, torch.tensor([unguided.get(o, 0.0) for o in outcomes]))
    assert p_guided > ALPHA
    assert p_unguided < ALPHA
