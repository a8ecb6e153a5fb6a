"""User-provided drafters change speed, never output (tiny preset)."""
from __future__ import annotations

import random

from interlock.engine import Engine, EngineConfig
from interlock.protocol.speculative import SpeculativeConfig

from helpers import assert_all_free, case


class Oracle:
    """Knows the answer: proposes the next tokens of the output the request produces alone."""

    def __init__(self, prompt_len: int, answer: tuple[int, ...]) -> None:
        self.prompt_len, self.answer = prompt_len, answer
        self.calls = 0

    def propose(self, requests, k):
        self.calls += 1
        return [list(self.answer[len(r.tokens) - self.prompt_len:][:k]) for r in requests]


class Junk:
    """Random ids, some outside the vocabulary."""

    def __init__(self) -> None:
        self.rng = random.Random(0)

    def propose(self, requests, k):
        return [[self.rng.randrange(-5, 5000) for _ in range(self.rng.randrange(k + 2))] for _ in requests]


async def complete(tiny, drafter, i: int):
    prompt, grammar, sampling = case(i)
    config = EngineConfig(speculative=SpeculativeConfig(drafters=(), user_drafter=drafter, max_draft_len=3),
                          max_batch_size=2)
    async with Engine(tiny, config) as engine:
        result = await engine.complete(prompt, grammar=grammar, sampling=sampling)
        await assert_all_free(engine)
    return result


async def test_oracle_drafter_is_accepted_and_changes_nothing(tiny, alone) -> None:
    for i in (0, 1, 2):
        prompt_len = len(tiny.tokenizer.encode_prompt(case(i)[0]))
        oracle = Oracle(prompt_len, alone[i])
        result = await complete(tiny, oracle, i)
        assert result.token_ids == alone[i] and oracle.calls > 0
        assert result.stats.accepted == result.stats.drafted        # every oracle draft is right
        assert result.stats.mean_acceptance_length > 2.0


async def test_junk_drafter_changes_nothing(tiny, alone) -> None:
    for i in (0, 1, 2, 3):
        assert (await complete(tiny, Junk(), i)).token_ids == alone[i]
