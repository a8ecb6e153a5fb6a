"""The masked target law of a request's first tokens, computed directly from the model (not through
the engine), for the engine-level statistical tests; and `draw`, their samples through the engine."""
from __future__ import annotations

from collections import defaultdict

import anyio
import torch

from interlock.grammars.bitmask import allocate_bitmask
from interlock.kernels import apply_token_bitmask_, probs_from_logits
from interlock.models.batch import SeqChunk, build_batch
from interlock.models.kv_cache import PagedKVCache

from helpers import complete_all


async def draw(engine, prompt: str, grammar, samplings: list, workers: int = 16
               ) -> tuple[list[tuple[int, ...]], int, int]:
    """(each request's tokens, drafts proposed, drafts accepted) of one request per sampling,
    `workers` at a time."""
    done = await complete_all(engine, [(prompt, grammar, s) for s in samplings], timeout_s=1800, concurrency=workers)
    return [c.token_ids for c in done], sum(c.stats.drafted for c in done), sum(c.stats.accepted for c in done)


def logits_after(tiny, prompt: list[int], nexts: list[int]) -> torch.Tensor:
    """Target logits [1 + len(nexts), V] after prompt and after each prefix of nexts, computed the way
    the engine does: prefill prompt[:-1], then one row-path chunk [prompt[-1], *nexts]."""
    kv = PagedKVCache(tiny.config, num_blocks=16, block_size=16)
    kv.add_sequence(0)
    kv.reserve(0, len(prompt) - 1)
    if len(prompt) > 1:
        tiny.model(build_batch([SeqChunk(0, tuple(prompt[:-1]), 0, ())], kv), kv)
    tail = (prompt[-1], *nexts)
    start = kv.reserve(0, len(tail))
    return tiny.model(build_batch([SeqChunk(0, tail, start, tuple(range(len(tail))))], kv), kv)


def target_law(tiny, engine, prompt: str, grammar, n: int, temperature: float, top_k: int | None,
               top_p: float | None) -> dict[tuple[int, ...], float]:
    """P(output's first n tokens) under the grammar-masked, temperature/top-k/top-p target. An
    outcome shorter than n ended with a stop token (which outputs do not include)."""
    tok = tiny.tokenizer
    ids = tok.encode_prompt(prompt)
    matcher = anyio.run(engine.grammars.matcher, grammar)
    bitmask = allocate_bitmask(1, tiny.config.vocab_size)
    eos = set(tok.eos_token_ids)
    law: dict[tuple[int, ...], float] = defaultdict(float)
    params = (torch.tensor([float(temperature)]), torch.tensor([top_k]) if top_k else None,
              torch.tensor([float(top_p)]) if top_p else None)

    def probs(prefix: list[int]) -> torch.Tensor:
        x = logits_after(tiny, ids, prefix)[-1:].float().clone()   # an inference tensor: copy before masking
        x[:, tok.vocab_size:] = float("-inf")
        assert matcher.accept(prefix)
        matcher.fill_mask(bitmask, 0)
        matcher.rollback(len(prefix))
        apply_token_bitmask_(x, bitmask)
        return probs_from_logits(x, *params)[0]

    def walk(prefix: list[int], mass: float) -> None:
        if len(prefix) == n:
            law[tuple(prefix)] += mass
            return
        p = probs(prefix)
        for t in p.nonzero().flatten().tolist():
            if t in eos:
                law[tuple(prefix)] += mass * float(p[t])
            else:
                walk(prefix + [t], mass * float(p[t]))

    walk([], 1.0)
    return dict(law)


def first_two_law(tiny, engine, prompt: str, grammar, *, temperature: float = 1.0, top_k: int | None = None,
                  scale: float | None = None, penalties: dict[str, float] | None = None
                  ) -> dict[tuple[int, int], float]:
    """P(output's first two tokens) under the grammar-masked, temperature / top-k target of a
    request with classifier-free guidance at `scale` (the default negative prompt) and / or the
    `penalties` (SamplingParams' penalty fields): each row guided, then penalized (repetition over
    prompt + output ids, frequency / presence over output ids), then masked, from the model
    directly. Assumes no stop token among the first two (the callers check every sample's length)."""
    from interlock.engine.intake import EMPTY_CHAT
    from interlock.kernels.cfg import cfg_combine
    from interlock.kernels.penalties_reference import apply_penalties_reference

    tok = tiny.tokenizer
    cond, uncond = tok.encode_prompt(prompt), tok.encode_prompt(EMPTY_CHAT)
    matcher = anyio.run(engine.grammars.matcher, grammar)
    bitmask = allocate_bitmask(1, tiny.config.vocab_size)
    v = tiny.config.vocab_size
    seen = torch.zeros(1, v, dtype=torch.bool)
    seen[0, cond] = True
    params = {k: torch.tensor([float(x)]) for k, x in (penalties or {}).items()}

    def probs(prefix: list[int]) -> torch.Tensor:
        x = logits_after(tiny, cond, prefix)[-1:].float().clone()      # an inference tensor: copy before masking
        if scale is not None:
            x = cfg_combine(x, logits_after(tiny, uncond, prefix)[-1:].float(), torch.tensor([scale]))
        if penalties:
            counts = torch.zeros(1, v, dtype=torch.long)
            for t in prefix:
                counts[0, t] += 1
            x = apply_penalties_reference(x, counts, seen, params["presence_penalty"], params["frequency_penalty"],
                                          params["repetition_penalty"])
        x[:, tok.vocab_size:] = float("-inf")
        assert matcher.accept(prefix)
        matcher.fill_mask(bitmask, 0)
        matcher.rollback(len(prefix))
        apply_token_bitmask_(x, bitmask)
        return probs_from_logits(x, torch.tensor([temperature]), torch.tensor([top_k]) if top_k else None, None)[0]

    first = probs([])
    law = {}
    for t0 in first.nonzero().flatten().tolist():
        second = probs([t0])
        for t1 in second.nonzero().flatten().tolist():
            law[(t0, t1)] = float(first[t0]) * float(second[t1])
    return law


def complete_laws(tiny, engine, prompt: str, grammar, temperature: float
                  ) -> tuple[dict[tuple[int, ...], float], dict[tuple[int, ...], float], float]:
    """(masked, conditional, P(L)): the laws of a constrained request's complete outputs (stop token left
    out), by scoring every token sequence the grammar accepts. masked: each token from the model's
    row with the refused ids removed and renormalised; conditional: P(x) 1[x in L] / P(L), P the
    model's unmasked law at `temperature`. For grammars whose outputs are few and short."""
    tok = tiny.tokenizer
    ids = tok.encode_prompt(prompt)
    matcher = anyio.run(engine.grammars.matcher, grammar)
    bitmask = allocate_bitmask(1, tiny.config.vocab_size)
    eos = set(tok.eos_token_ids)
    masked: dict[tuple[int, ...], float] = {}
    model: dict[tuple[int, ...], float] = {}
    temp = torch.tensor([float(temperature)])

    def rows(prefix: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        x = logits_after(tiny, ids, prefix)[-1:].float().clone()   # an inference tensor: copy before masking
        x[:, tok.vocab_size:] = float("-inf")
        p = probs_from_logits(x, temp)[0]
        assert matcher.accept(prefix)
        matcher.fill_mask(bitmask, 0)
        matcher.rollback(len(prefix))
        apply_token_bitmask_(x, bitmask)
        return p, probs_from_logits(x, temp)[0]

    def walk(prefix: list[int], p_masked: float, p_model: float) -> None:
        p, pm = rows(prefix)
        for t in pm.nonzero().flatten().tolist():
            if t in eos:
                masked[tuple(prefix)] = p_masked * float(pm[t])
                model[tuple(prefix)] = p_model * float(p[t])
            else:
                walk(prefix + [t], p_masked * float(pm[t]), p_model * float(p[t]))

    walk([], 1.0, 1.0)
    total = sum(model.values())
    return masked, {x: v / total for x, v in model.items()}, total
