"""law="conditional": one request as a sequence of attempts, by adaptive rejection.

Each attempt is an internal request (id "<request>.<i>") carrying a frozen snapshot of the request's
Trie (engine/trie.py). The VerifierActor samples it from the model's law with the mass earlier
attempts proved dead removed, and a token the grammar refuses ends it with an AttemptRefused; the
driver records what the attempt saw and starts the next one (with prefix caching the re-prefill of
the prompt is mostly cached). The first attempt that completes is an exact sample of
P(x | x in L) (docs/speculation.md, "Two laws"), and only its deltas are delivered: a conditional
request streams nothing until it is accepted, then its whole output at once.

An attempt that runs out of context ends with "length": a rejection that teaches nothing. Past
SamplingParams.max_attempts the request fails with ConditionalAttemptsError.
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

from interlock.engine.trie import Trie
from interlock.protocol.errors import AttemptRefused, ConditionalAttemptsError
from interlock.protocol.messages import RequestSpec
from interlock.protocol.sampling import Delta

SEED_STRIDE = 0x9E3779B97F4A7C15        # attempt i of a seeded request draws from seed + i * stride (mod 2**64)


@dataclass
class ConditionalTotals:
    """The engine's counts since start (EngineMetrics' conditional_* fields)."""

    conditional_requests: int = 0
    conditional_attempts: int = 0
    conditional_rejected_tokens: int = 0


def attempt_seed(seed: int | None, attempt: int) -> int | None:
    """Attempt i's own seed: distinct streams for distinct attempts, the same ones for the same seed."""
    return None if seed is None else (seed + attempt * SEED_STRIDE) % 2**64


async def run_conditional(attempt: Callable[[RequestSpec], AsyncIterator[Delta]], spec: RequestSpec,
                          max_nodes: int, totals: ConditionalTotals) -> AsyncIterator[Delta]:
    """The accepted attempt's deltas, its stats counting every attempt; `attempt(spec)` runs one."""
    trie = Trie(max_nodes)
    start = time.perf_counter()
    rejected_tokens = 0
    for i in range(spec.sampling.max_attempts):
        one = replace(spec, request_id=f"{spec.request_id}.{i}", trie=trie.freeze(),
                      sampling=replace(spec.sampling, seed=attempt_seed(spec.sampling.seed, i)))
        totals.conditional_attempts += 1
        try:
            deltas = [d async for d in attempt(one)]
        except AttemptRefused as refused:
            trie.record(refused.visits)
            rejected_tokens += len(refused.visits)
            totals.conditional_rejected_tokens += len(refused.visits)
            continue
        last = deltas[-1]
        if last.finish_reason != "stop" or last.stats is None:      # out of context: rejected, nothing learned
            n = sum(len(d.token_ids) for d in deltas)
            rejected_tokens += n
            totals.conditional_rejected_tokens += n
            continue
        totals.conditional_requests += 1
        elapsed = time.perf_counter() - start
        stats = replace(last.stats, attempts=i + 1, rejected_tokens=rejected_tokens, ttft_s=elapsed, elapsed_s=elapsed)
        for d in deltas[:-1]:
            yield d
        yield replace(last, stats=stats)
        return
    raise ConditionalAttemptsError(spec.sampling.max_attempts, trie.live_mass)
