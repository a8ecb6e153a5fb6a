"""EngineConfig.threads: the model lane's torch threads, and the default that avoids a second
OpenMP pool (streams/cpu_timeline.py says why); outputs do not depend on it."""
from __future__ import annotations

import os
import threading

import pytest
import torch

from interlock.engine import Engine, EngineConfig, lane_threads
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from helpers import complete_all


def in_a_thread_at(n: int, fn):
    """fn() in a fresh thread whose torch runs at n threads (leaves this thread's setting alone)."""
    out = {}

    def run() -> None:
        torch.get_num_threads()
        torch.set_num_threads(n)
        out["value"] = fn()
    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out["value"]


def test_default_gives_the_lane_two_threads_only_when_the_caller_runs_one() -> None:
    assert in_a_thread_at(1, lambda: lane_threads(None)) == min(2, len(os.sched_getaffinity(0)))
    assert in_a_thread_at(2, lambda: lane_threads(None)) == 1
    assert in_a_thread_at(2, lambda: lane_threads(3)) == 3


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_bad_threads_are_refused(bad) -> None:
    with pytest.raises(ValueError):
        EngineConfig(threads=bad)


async def test_greedy_output_is_the_same_at_one_and_two_lane_threads(tiny) -> None:
    """The CLI's default (2 lane threads) against the tests' usual 1, speculative and plain, batched."""
    prompts = ["Once upon a time", "abc abc abc abc", "JSON please", "List three colors:"]
    sampling = SamplingParams(max_tokens=24)
    outs = {}
    for threads in (1, 2):
        for spec in (None, SpeculativeConfig(("ngram", "forced"), max_draft_len=3)):
            async with Engine(tiny, EngineConfig(speculative=spec, max_batch_size=4, threads=threads)) as engine:
                done = await engine.complete(prompts[0], sampling=sampling)
                together = await complete_all(engine, [(p, None, sampling) for p in prompts])     # and the four
                outs[threads, spec is not None] = (done.token_ids, tuple(c.token_ids for c in together))
    assert len(set(outs.values())) == 1, outs
    alone, batched = outs[1, False]
    assert alone == batched[0]
