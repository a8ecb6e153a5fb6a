"""The step's grammar work in one batch pass per backend (the default) or request by request
(GrammarConfig.batched_masks=False) gives the same outputs: greedy, speculative, both backends and a
switching grammar in one batch."""
from __future__ import annotations

import pytest

from interlock.engine import Engine, EngineConfig
from interlock.grammars.batch_xgrammar import XGrammarBatch
from interlock.protocol.grammar import GrammarConfig
from interlock.protocol.speculative import SpeculativeConfig

from helpers import assert_all_free, case, complete_all


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
async def test_batched_and_per_request_grammar_work_agree(tiny, backend: str, monkeypatch) -> None:
    calls = []
    fill = XGrammarBatch.fill
    monkeypatch.setattr(XGrammarBatch, "fill", lambda self, *a, **k: calls.append(1) or fill(self, *a, **k))
    cases = [case(i) for i in range(8)]
    outs = {}
    for batched in (True, False):
        calls.clear()
        config = EngineConfig(speculative=SpeculativeConfig.parse("ngram+forced", max_draft_len=3), max_batch_size=4,
                              grammar=GrammarConfig(backend=backend, batched_masks=batched))
        async with Engine(tiny, config) as engine:
            outs[batched] = [c.token_ids for c in await complete_all(engine, cases)]
            await assert_all_free(engine)
        if backend == "xgrammar":
            assert bool(calls) == batched          # the batch path ran exactly when asked for
    assert outs[True] == outs[False]
