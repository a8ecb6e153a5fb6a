"""Read a GGUF checkpoint with the `gguf` package: config from metadata, weights dequantized to HF names.

GGUF conversion of Llama checkpoints interleaves the rows of attn_q / attn_k per head (llama.cpp's
RoPE pairs dimensions (2i, 2i+1); HF pairs (i, i + D/2)). `unpermute` undoes that, so the forward
has one RoPE layout for every checkpoint.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from interlock.models.config import ModelConfig
from interlock.protocol.errors import ModelLoadError, UnsupportedModelError
from interlock.protocol.types import Dtype

SUPPORTED_ARCHS = ("llama", "qwen2", "mistral")
SUPPORTED_QUANTS = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q8_K")
_PERMUTED_ARCHS = ("llama", "mistral")      # qwen2 keeps HF's rotate-half layout in GGUF

_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's Q/K permutation: rows (head, D/2, 2) -> (head, 2, D/2)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def read_config(reader: Any, dtype: Dtype) -> tuple[ModelConfig, torch.Tensor | None]:
    """ModelConfig from GGUF metadata, plus llama3 `rope_freqs` inverse frequencies when present."""
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModelError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")

    def meta(key: str, default: Any = None) -> Any:
        return _field(reader, f"{arch}.{key}", default)

    n_heads = int(meta("attention.head_count"))
    hidden = int(meta("embedding_length"))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(meta("vocab_size", len(tokens.data) if tokens is not None else 0))
    scaling_type = meta("rope.scaling.type")
    if scaling_type not in (None, "none", "llama3"):
        raise UnsupportedModelError(f"RoPE scaling type {scaling_type!r} is not supported")
    names = {t.name for t in reader.tensors}
    config = ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        n_layers=int(meta("block_count")),
        n_heads=n_heads,
        n_kv_heads=int(meta("attention.head_count_kv", n_heads)),
        intermediate_size=int(meta("feed_forward_length")),
        head_dim=int(meta("attention.key_length", hidden // n_heads)),
        rms_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(meta("rope.freq_base", 10000.0)),
        max_position=int(meta("context_length", 2048)),
        tie_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        dtype=dtype,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
    )
    inv_freq = None
    if "rope_freqs.weight" in names:        # llama3: GGUF stores per-dimension frequency divisors
        from interlock.models.rope import inv_frequencies

        factors = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
        base = inv_frequencies(config.head_dim, config.rope_theta)
        inv_freq = base / torch.from_numpy(np.asarray(factors.data, dtype=np.float32).copy())
    return config, inv_freq


def read_weights(reader: Any, config: ModelConfig, arch: str) -> dict[str, torch.Tensor]:
    """Every tensor dequantized to fp32 numpy, renamed to HF names, Q/K rows un-permuted."""
    from gguf import quants

    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            continue
        kind = t.tensor_type.name
        if kind not in SUPPORTED_QUANTS:
            raise UnsupportedModelError(
                f"tensor {t.name} uses quantization {kind}, which is not supported "
                f"(supported: {', '.join(SUPPORTED_QUANTS)}); re-quantize the GGUF (e.g. Q8_0 or Q4_K_M)")
        # F32 tensors come back as read-only views of the memory map: copy those.
        w = np.array(quants.dequantize(t.data, t.tensor_type), dtype=np.float32, copy=not kind.startswith("Q"))
        if t.name.startswith("blk."):
            _, layer, rest = t.name.split(".", 2)
            if rest not in _LAYER_NAMES:
                raise UnsupportedModelError(f"unexpected GGUF tensor {t.name}")
            if arch in _PERMUTED_ARCHS and rest.startswith("attn_q."):
                w = unpermute(w, config.n_heads)
            elif arch in _PERMUTED_ARCHS and rest.startswith("attn_k."):
                w = unpermute(w, config.n_kv_heads)
            name = f"model.layers.{layer}.{_LAYER_NAMES[rest]}"
        elif t.name in _NAMES:
            name = _NAMES[t.name]
        else:
            raise UnsupportedModelError(f"unexpected GGUF tensor {t.name}")
        out[name] = torch.from_numpy(np.ascontiguousarray(w))
    return out


def load_gguf(path: Path, dtype: Dtype) -> tuple[ModelConfig, dict[str, torch.Tensor], torch.Tensor | None]:
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError) as exc:
        raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from exc
    config, inv_freq = read_config(reader, dtype)
    return config, read_weights(reader, config, _field(reader, "general.architecture")), inv_freq
