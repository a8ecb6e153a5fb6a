"""The forward's step costs against a weight-streaming floor, for benchmarks/model_speed.py.

- floor: the time to read every int8 weight matrix of the model once (layers and head), with the
  fastest plain reduction torch has for the bytes (`amax` of the int8 values, or a sum of them
  viewed as int64), at the same thread count. A decode step cannot read its weights faster.
- step: one forward of `rows` new tokens of one sequence after `context` cached tokens (1 row: a
  decode step; 4 rows: a K=3 verify step), the cache rewound after each so every repeat sees the
  same context. Batch building is inside the timing, as in the engine; `head=False` leaves the head out.
- prefill: a `prompt`-token prompt prefilled in the engine's 256-token chunks, as tokens/s.
- kv_dtype: what the KV cache stores in the step and prefill measurements (the model's own unless
  the caller names another: the same weights can be timed with each cache side by side).
All times are medians over `repeats` after one warm-up.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from interlock.benchmarks.common import median, repeat_times
from interlock.models.batch import SeqChunk, build_batch
from interlock.models.config import ModelConfig
from interlock.models.kv_cache import PagedKVCache
from interlock.models.llama import Transformer
from interlock.protocol.types import Dtype

PREFILL_CHUNK = 256          # EngineConfig.prefill_chunk's default


def _median_s(fn: Callable[[], object], repeats: int) -> float:
    return median(repeat_times(fn, repeats))


def kernel_weights(model: Transformer) -> list[torch.Tensor]:
    """What a decode step's kernels read of each projection and the head (int8 rows and scales, int4
    records and offsets): the bytes the floor reads."""
    linears = [lin[name] for lin in model._linears for name in ("wqkv", "wo", "w13", "w2")] + [model._head]
    if not all(hasattr(lin, "kernel_weights") for lin in linears):
        raise ValueError("the floor is defined for quantized weights: load the model with weights='int8' or 'int4'")
    return [t for lin in linears for t in lin.kernel_weights]


def weight_floor_s(model: Transformer, repeats: int) -> float:
    weights = kernel_weights(model)
    reads = [lambda: [w.amax() for w in weights]]
    # as int64 words: fewer, wider loads (an int4 offsets row of 18 fp16s views only when flat)
    if all(w.is_contiguous() and w.numel() * w.element_size() % 8 == 0 for w in weights):
        reads.append(lambda: [w.reshape(-1).view(torch.int64).sum() for w in weights])
    return min(_median_s(read, repeats) for read in reads)


def _tokens(model: Transformer, n: int, seed: int) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist())


def _prefill(model: Transformer, kv: PagedKVCache, prompt: tuple[int, ...]) -> None:
    """Sequence 0's prompt into kv, in the engine's chunks."""
    for offset in range(0, len(prompt), PREFILL_CHUNK):
        part = prompt[offset: offset + PREFILL_CHUNK]
        start = kv.reserve(0, len(part))
        model(build_batch([SeqChunk(0, part, start, (len(part) - 1,))], kv), kv)


def _config(model: Transformer, kv_dtype: Dtype | None) -> ModelConfig:
    """The model's config with its KV cache stored as `kv_dtype` (None: the model's own)."""
    return model.config if kv_dtype is None else model.config.replace(kv_dtype=kv_dtype)


def step_s(model: Transformer, context: int, rows: int, repeats: int, kv_dtype: Dtype | None = None,
           head: bool = True) -> float:
    """head=False: the layers and the final norm only (`final_hidden`), about what a greedy verify step
    costs when each row's mask allows a few ids (Transformer.head_argmax computes only those logits)."""
    kv = PagedKVCache(_config(model, kv_dtype), num_blocks=-(-(context + rows) // 16) + 1, block_size=16)
    kv.add_sequence(0)
    _prefill(model, kv, _tokens(model, context, seed=context))
    new = _tokens(model, rows, seed=1)
    forward = model if head else model.final_hidden

    def step() -> None:
        start = kv.reserve(0, rows)
        forward(build_batch([SeqChunk(0, new, start, tuple(range(rows)))], kv), kv)
        kv.rewind(0, rows)

    return _median_s(step, repeats)


def prefill_tok_s(model: Transformer, prompt_len: int, repeats: int, kv_dtype: Dtype | None = None) -> float:
    prompt = _tokens(model, prompt_len, seed=prompt_len)

    def prefill() -> None:
        kv = PagedKVCache(_config(model, kv_dtype), num_blocks=-(-prompt_len // 16), block_size=16)
        kv.add_sequence(0)
        _prefill(model, kv, prompt)

    return prompt_len / _median_s(prefill, repeats)


@dataclass(frozen=True)
class StepCosts:
    context: int
    kv_dtype: str
    floor_ms: float
    decode_ms: float
    verify4_ms: float
    prefill_tok_s: float

    @property
    def decode_over_floor(self) -> float:
        return self.decode_ms / self.floor_ms

    @property
    def verify4_over_decode(self) -> float:
        return self.verify4_ms / self.decode_ms


def measure(model: Transformer, context: int, repeats: int, kv_dtype: Dtype | None = None) -> StepCosts:
    """Step costs at `context` with the KV cache in `kv_dtype` (None: the model's own)."""
    return StepCosts(context, _config(model, kv_dtype).cache_dtype, floor_ms=weight_floor_s(model, repeats) * 1e3,
                     decode_ms=step_s(model, context, 1, repeats, kv_dtype) * 1e3,
                     verify4_ms=step_s(model, context, 4, repeats, kv_dtype) * 1e3,
                     prefill_tok_s=prefill_tok_s(model, context, max(1, repeats // 4), kv_dtype))
