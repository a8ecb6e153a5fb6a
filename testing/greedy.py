"""Plain greedy decoding on one sequence: the reference loop tests compare the engine against.

The engine (actors/) does the real work; this stays small on purpose so that its output can be
trusted as "what the model says" when the engine's speculative output is compared against it.
`greedy_reference` is the same loop with a request's per-token features, applied one token at a
time as their definitions say: classifier-free guidance (a second sequence fed the negative
prompt and the same tokens, combined before the argmax), repetition / frequency / presence
penalties (over the prompt and the output so far) and logprobs (of each token, under its row).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from interlock.kernels.cfg import cfg_combine
from interlock.kernels.logprobs import token_logprobs
from interlock.kernels.penalties import apply_penalties
from interlock.protocol.sampling import SamplingParams, TokenLogprob

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


def greedy_reference(model: Transformer, prompt: Sequence[TokenId], sampling: SamplingParams, *,
                     negative: Sequence[TokenId] | None = None, vocab: int | None = None,
                     stop_ids: Sequence[TokenId] = ()) -> tuple[list[TokenId], list[TokenLogprob] | None]:
    """Greedy tokens after `prompt` under `sampling`'s features (module docstring), up to
    sampling.max_tokens or a stop id (kept), and their logprobs when sampling.logprobs is set.

    negative: the guidance's negative prompt (needed when sampling.guidance_scale is set); vocab:
    the tokenizer's size, where the model's rows are wider (ids past it are never chosen).
    """
    if not sampling.greedy:
        raise ValueError("greedy_reference decodes greedily: temperature 0")
    scale = sampling.guidance_scale
    if scale is not None and negative is None:
        raise ValueError("guidance needs the negative prompt")
    seqs = [list(prompt)] + ([list(negative)] if scale is not None else [])        # type: ignore[arg-type]
    v = model.config.vocab_size
    seen = torch.zeros(1, v, dtype=torch.bool)
    seen[0, torch.tensor(list(prompt)).clamp(0, v - 1)] = True
    counts = torch.zeros(1, v, dtype=torch.int32)
    out: list[TokenId] = []
    logprobs: list[TokenLogprob] = []
    for _ in range(sampling.max_tokens):
        rows = [greedy_logits(model, seq) for seq in seqs]                            # [V] each
        x = rows[0][None].float().clone()           # [1, V]; the forward returns an inference tensor
        if scale is not None and scale != 1.0:
            x = cfg_combine(x, rows[1][None].float(), torch.tensor([float(scale)]))
        if sampling.penalized:
            x = apply_penalties(x, counts, seen, torch.tensor([sampling.presence_penalty]),
                                torch.tensor([sampling.frequency_penalty]), torch.tensor([sampling.repetition_penalty]))
        x[:, vocab if vocab is not None else v:] = float("-inf")
        token = int(torch.argmax(x[0]))
        if sampling.logprobs is not None:
            n = sampling.logprobs
            lp = token_logprobs(x, torch.tensor([token]), torch.zeros(1), n=n)
            logprobs.append(TokenLogprob.from_row(token, float(lp.token[0]), lp.top_ids[0].tolist(),
                                                  lp.top[0].tolist(), n))
        out.append(token)
        counts[0, token] += 1
        for seq in seqs:
            seq.append(token)
        if token in stop_ids:
            break
    return out, logprobs if sampling.logprobs is not None else None


def greedy_logits(model: Transformer, tokens: Sequence[TokenId]) -> torch.Tensor:
    """The model's logits [V] after `tokens`, from a fresh cache (one chunk: slow and obvious)."""
    kv = PagedKVCache(model.config, num_blocks=-(-len(tokens) // 16), block_size=16)
    kv.add_sequence(0)
    start = kv.reserve(0, len(tokens))
    return model(build_batch([SeqChunk(0, tuple(tokens), start, (len(tokens) - 1,))], kv), kv)[-1]
