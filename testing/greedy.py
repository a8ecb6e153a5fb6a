"""Plain greedy decoding on one sequence: the reference loop tests compare the engine against.

The engine (actors/) does the real work; this stays small on purpose so that its output can be
trusted as "what the model says" when the engine's speculative output is compared against it.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from interlock.models.batch import SeqChunk, build_batch
from interlock.models.config import ModelConfig
from interlock.models.kv_cache import PagedKVCache
from interlock.models.llama import Transformer
from interlock.protocol.errors import PromptTooLongError
from interlock.protocol.types import TokenId


def check_prompt_fits(config: ModelConfig, prompt_len: int, max_new_tokens: int = 1) -> None:
    """Raise PromptTooLongError unless prompt + at least one new token fit the context window."""
    if prompt_len == 0:
        raise PromptTooLongError("the prompt is empty: give at least one token")
    if prompt_len + 1 > config.max_position:
        raise PromptTooLongError(
            f"prompt has {prompt_len} tokens; the model's context window is {config.max_position} "
            f"(prompt + at least 1 generated token must fit): shorten the prompt")


def greedy_generate(model: Transformer, prompt: Sequence[TokenId], max_new_tokens: int, *,
                    stop_ids: Sequence[TokenId] = (), kv: PagedKVCache | None = None,
                    prefill_chunk: int = 512) -> list[TokenId]:
    """Greedy tokens after `prompt` (prompt excluded), stopping after a stop id or max_new_tokens.

    Uses a private sequence in `kv` (a fresh cache if None) and frees it before returning.
    """
    config = model.config
    check_prompt_fits(config, len(prompt), max_new_tokens)
    budget = min(max_new_tokens, config.max_position - len(prompt))
    if kv is None:
        kv = PagedKVCache(config, num_blocks=-(-(len(prompt) + budget) // 16), block_size=16)
    seq = max(kv.sequences, default=-1) + 1
    kv.add_sequence(seq)
    try:
        out: list[TokenId] = []
        pending = list(prompt)
        while len(out) < budget:
            for i in range(0, len(pending), prefill_chunk):      # chunked prefill, then 1-token steps
                piece = pending[i:i + prefill_chunk]
                start = kv.reserve(seq, len(piece))
                last = i + prefill_chunk >= len(pending)
                batch = build_batch([SeqChunk(seq, tuple(piece), start, (len(piece) - 1,) if last else ())], kv)
                logits = model(batch, kv)
            token = int(torch.argmax(logits[-1]))
            out.append(token)
            if token in stop_ids:
                break
            pending = [token]
        return out
    finally:
        kv.free(seq)
