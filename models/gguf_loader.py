"""Read a GGUF checkpoint with the `gguf` package: config from metadata, weights dequantized to HF names.

GGUF conversion of Llama checkpoints interleaves the rows of attn_q / attn_k per head (llama.cpp's
RoPE pairs dimensions (2i, 2i+1); HF pairs (i, i + D/2)). `unpermute` undoes that, so the forward
has one RoPE layout for every checkpoint. The other families keep HF's layout in GGUF.

The architectures as llama.cpp names them, and what llama.cpp's converter does to each that the
metadata does not say: gemma3 stores every norm as 1 + w (read with no shift, checkpoint.py), has a
global layer every 6th, sliding layers with RoPE base 10000, and a softmax scale of
1/sqrt(head_dim) (1/sqrt(hidden / heads) for the 62-layer 27B, whose query_pre_attn_scalar that
is); phi3 fuses q/k/v into attn_qkv and gate/up into ffn_up, and keeps longrope's factors as the
tensors rope_factors_short / rope_factors_long.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from interlock.models.config import ModelConfig, RopeScaling
from interlock.protocol.errors import ModelLoadError, UnsupportedModelError
from interlock.protocol.types import Dtype

SUPPORTED_ARCHS = ("llama", "qwen2", "mistral", "qwen3", "gemma3", "phi3")
FAMILY = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3", "phi3": "phi3"}
GEMMA3_PATTERN, GEMMA3_LOCAL_THETA = 6, 10000.0     # fixed by llama.cpp for gemma3, not in the metadata
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
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Where an architecture names a tensor otherwise (HF names as models/checkpoint.py reads them).
_ARCH_LAYER_NAMES = {
    "gemma3": {"ffn_norm.weight": "pre_feedforward_layernorm.weight",
               "post_attention_norm.weight": "post_attention_layernorm.weight",
               "post_ffw_norm.weight": "post_feedforward_layernorm.weight"},
    "phi3": {"ffn_up.weight": "mlp.gate_up_proj.weight"},
}
_ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight")


def layer_names(arch: str) -> dict[str, str]:
    """GGUF layer tensor name (after `blk.N.`) -> HF name, for this architecture."""
    return {**_LAYER_NAMES, **_ARCH_LAYER_NAMES.get(arch, {})}


def unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's Q/K permutation: rows (head, D/2, 2) -> (head, 2, D/2)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def _tensor(reader: Any, name: str) -> np.ndarray | None:
    t = next((t for t in reader.tensors if t.name == name), None)
    return None if t is None else np.asarray(t.data, dtype=np.float32).copy()


def _family_fields(reader: Any, arch: str, meta: Any, hidden: int, n_heads: int, head_dim: int, n_layers: int,
                   max_position: int) -> dict[str, Any]:
    """The ModelConfig fields where the architectures differ (the module docstring says what llama.cpp fixes)."""
    window = int(meta("attention.sliding_window", 0) or 0)
    if arch == "qwen3":
        return {"qk_norm": True}
    if arch == "gemma3":
        scaling = None
        if meta("rope.scaling.type") == "linear":
            scaling = RopeScaling(factor=float(meta("rope.scaling.factor")), kind="linear")
        scalar = hidden // n_heads if n_layers == 62 else head_dim
        sliding = tuple(i for i in range(n_layers) if (i + 1) % GEMMA3_PATTERN)
        return {"qk_norm": True, "post_norms": True, "activation": "gelu_tanh", "embed_scale": hidden ** 0.5,
                "attn_scale": scalar ** -0.5, "rope_local_theta": GEMMA3_LOCAL_THETA, "rope_scaling": scaling,
                "sliding_window": window if 0 < window < max_position else 0,
                "sliding_layers": sliding if 0 < window < max_position else ()}
    if arch == "phi3":
        rotary = int(meta("rope.dimension_count", head_dim))
        short, long = _tensor(reader, "rope_factors_short.weight"), _tensor(reader, "rope_factors_long.weight")
        scaling = None
        if short is not None and long is not None:
            original = int(meta("rope.scaling.original_context_length"))
            scaling = RopeScaling(factor=max_position / original, original_max_position=original, kind="longrope",
                                  short_factor=tuple(short.tolist()), long_factor=tuple(long.tolist()),
                                  attention_factor=float(meta("rope.scaling.attn_factor", 1.0)))
        slides = 0 < window < max_position
        return {"rotary_dim": rotary, "rope_scaling": scaling, "sliding_window": window if slides else 0,
                "sliding_layers": tuple(range(n_layers)) if slides else ()}
    return {}


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
    n_layers = int(meta("block_count"))
    head_dim = int(meta("attention.key_length", hidden // n_heads))
    max_position = int(meta("context_length", 2048))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(meta("vocab_size", len(tokens.data) if tokens is not None else 0))
    scaling_type = meta("rope.scaling.type")
    if scaling_type not in (None, "none", "llama3") and not (arch == "gemma3" and scaling_type == "linear"):
        raise UnsupportedModelError(f"RoPE scaling type {scaling_type!r} is not supported for {arch}")
    names = {t.name for t in reader.tensors}
    fields = {"rope_theta": float(meta("rope.freq_base", 10000.0)),
              **_family_fields(reader, arch, meta, hidden, n_heads, head_dim, n_layers, max_position)}
    config = ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=int(meta("attention.head_count_kv", n_heads)),
        intermediate_size=int(meta("feed_forward_length")),
        head_dim=head_dim,
        rms_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        max_position=max_position,
        tie_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        dtype=dtype,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
        family=FAMILY[arch],
        **fields,
    )
    inv_freq = None
    if "rope_freqs.weight" in names:        # llama3: GGUF stores per-dimension frequency divisors
        from interlock.models.rope import inv_frequencies

        base = inv_frequencies(config.rotary_dim, config.rope_theta)
        inv_freq = base / torch.from_numpy(_tensor(reader, "rope_freqs.weight"))
    return config, inv_freq


def hf_name(arch: str, gguf_name: str) -> str:
    """The HF name of a GGUF tensor (checkpoint.py reads those). Raises UnsupportedModelError for an unknown one."""
    if gguf_name.startswith("blk."):
        _, layer, rest = gguf_name.split(".", 2)
        names = layer_names(arch)
        if rest in names:
            return f"model.layers.{layer}.{names[rest]}"
    elif gguf_name in _NAMES:
        return _NAMES[gguf_name]
    raise UnsupportedModelError(f"unexpected GGUF tensor {gguf_name} for architecture {arch}")


def read_weights(reader: Any, config: ModelConfig, arch: str) -> dict[str, torch.Tensor]:
    """Every tensor dequantized to fp32 numpy, renamed to HF names, Q/K rows un-permuted."""
    from gguf import quants

    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        if t.name in _ROPE_TENSORS:          # read_config's
            continue
        kind = t.tensor_type.name
        if kind not in SUPPORTED_QUANTS:
            raise UnsupportedModelError(
                f"tensor {t.name} uses quantization {kind}, which is not supported "
                f"(supported: {', '.join(SUPPORTED_QUANTS)}); re-quantize the GGUF (e.g. Q8_0 or Q4_K_M)")
        name = hf_name(arch, t.name)
        # F32 tensors come back as read-only views of the memory map: copy those.
        w = np.array(quants.dequantize(t.data, t.tensor_type), dtype=np.float32, copy=not kind.startswith("Q"))
        if arch in _PERMUTED_ARCHS and ".self_attn.q_proj." in name:
            w = unpermute(w, config.n_heads)
        elif arch in _PERMUTED_ARCHS and ".self_attn.k_proj." in name:
            w = unpermute(w, config.n_kv_heads)
        out[name] = torch.from_numpy(np.ascontiguousarray(w))
    return out


def load_gguf(path: Path, dtype: Dtype) -> tuple[ModelConfig, dict[str, torch.Tensor], torch.Tensor | None]:
    from interlock.models.gguf_file import GGUFFile

    try:
        reader = GGUFFile(path)
    except (ValueError, OSError) as exc:
        raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from exc
    config, inv_freq = read_config(reader, dtype)
    return config, read_weights(reader, config, _field(reader, "general.architecture")), inv_freq
