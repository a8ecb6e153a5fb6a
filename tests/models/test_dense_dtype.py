"""The dtype of prompt-chunk GEMMs (models/linear.py `dense_dtype`): bf16 only where the CPU has
bf16 dot products, else fp32, which is also closer to the checkpoint's float weights."""
from __future__ import annotations

import torch

from interlock.models.batch import SeqChunk, build_batch
from interlock.models.kv_cache import PagedKVCache
from interlock.models.linear import dense_dtype_for
from interlock.models.loader import load_model


def test_bf16_only_where_the_cpu_has_bf16_dot_products() -> None:
    assert dense_dtype_for({"avx2", "fma", "avx512f", "avx512_vnni"}) == torch.float32
    assert dense_dtype_for({"avx512f", "avx512_bf16"}) == torch.bfloat16
    assert dense_dtype_for({"amx_tile", "amx_bf16", "amx_int8"}) == torch.bfloat16
    assert dense_dtype_for(set()) == torch.float32


def prompt_hidden(lm, tokens: tuple[int, ...]) -> torch.Tensor:
    kv = PagedKVCache(lm.config, num_blocks=8, block_size=16)
    kv.add_sequence(0)
    kv.reserve(0, len(tokens))
    return lm.model.final_hidden(build_batch([SeqChunk(0, tokens, 0, tuple(range(len(tokens))))], kv), kv)


def test_fp32_prompt_gemms_are_closer_to_the_float_model_than_bf16() -> None:
    """The int8 model's prompt path uses a copy of the float weights (rounded to bf16); its final
    hidden states come closer to the float model's with fp32 GEMMs than with bf16 ones (on average;
    the weights' own bf16 rounding stays)."""
    tokens = tuple(range(30, 90))
    float_lm = load_model("tiny", weights="float")
    float_lm.model.rows_prefill = False
    want = prompt_hidden(float_lm, tokens)
    lm = load_model("tiny")                                       # int8: decode rows quantized, prompts dense
    lm.model.rows_prefill = False
    errors = {}
    for dt in (torch.bfloat16, torch.float32):
        lm.model.set_dense_dtype(dt)
        errors[dt] = (prompt_hidden(lm, tokens) - want).abs().mean().item()
    assert 0 < errors[torch.float32] < errors[torch.bfloat16], errors
