"""Read an HF checkpoint directory: config.json plus *.safetensors (sharded or not).

`config_from_hf` turns each supported architecture's config.json into a ModelConfig: the family's
differences become data (config.py), and what interlock does not run is refused by name
(UnsupportedModelError) rather than run wrongly. Both config.json formats are read: the hub's
(`rope_scaling`, `rope_theta`, `rope_local_base_freq`, `sliding_window_pattern`) and the one
transformers 5 writes (`rope_parameters`, per layer type for Gemma 3, and `layer_types`).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from interlock.models.checkpoint import CheckpointReader, Layout, StateDictSource, TensorSource
from interlock.models.config import ModelConfig, RopeScaling
from interlock.protocol.errors import ModelLoadError, UnsupportedModelError
from interlock.protocol.types import Dtype

ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                 "Qwen3ForCausalLM": "qwen3", "Gemma3ForCausalLM": "gemma3",
                 "Gemma3ForConditionalGeneration": "gemma3", "Phi3ForCausalLM": "phi3"}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)
# Gemma3TextConfig's defaults: a multimodal Gemma 3's text_config leaves out whatever equals them.
GEMMA3_DEFAULTS = {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                   "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "rms_norm_eps": 1e-6,
                   "max_position_embeddings": 131_072, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
                   "query_pre_attn_scalar": 256, "sliding_window": 4096, "sliding_window_pattern": 6,
                   "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh"}


def _rope(params: dict[str, Any], cfg: dict[str, Any], rotary_dim: int) -> RopeScaling | None:
    """The scaling of one rope_scaling / rope_parameters dict; refuses the kinds not implemented."""
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in ("default", None):
        return None
    if kind == "llama3":
        return RopeScaling(factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
                           high_freq_factor=float(params["high_freq_factor"]),
                           original_max_position=int(params["original_max_position_embeddings"]))
    if kind == "linear":
        return RopeScaling(factor=float(params["factor"]), kind="linear")
    if kind in ("longrope", "su"):           # "su": Phi-3's first name for longrope
        original = int(cfg.get("original_max_position_embeddings") or params["original_max_position_embeddings"])
        factor = float(params.get("factor") or cfg["max_position_embeddings"] / original)
        attention = params.get("attention_factor")
        if attention is None:
            attention = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0
        if len(params["short_factor"]) != rotary_dim // 2:
            raise UnsupportedModelError(f"longrope factors for {len(params['short_factor']) * 2} rotary dims, "
                                        f"the heads rotate {rotary_dim}")
        return RopeScaling(factor=factor, original_max_position=original, kind="longrope",
                           short_factor=tuple(params["short_factor"]), long_factor=tuple(params["long_factor"]),
                           attention_factor=float(attention))
    raise UnsupportedModelError(f"RoPE scaling type {kind!r} is not supported (supported: llama3, linear, longrope)")


def _windows(cfg: dict[str, Any], family: str, n_layers: int, max_position: int) -> tuple[int, tuple[int, ...]]:
    """(sliding_window, sliding layers): `layer_types` where the config lists them, else each family's rule."""
    window = int(cfg.get("sliding_window") or 0)
    if cfg.get("layer_types"):
        layers = [i for i, t in enumerate(cfg["layer_types"]) if t == "sliding_attention"]
    elif family == "gemma3":              # every `pattern`-th layer is global
        pattern = int(cfg["sliding_window_pattern"])
        layers = [i for i in range(n_layers) if (i + 1) % pattern]
    elif family in ("qwen2", "qwen3"):
        first = int(cfg.get("max_window_layers", n_layers))
        layers = list(range(first, n_layers)) if cfg.get("use_sliding_window") else []
    else:                                 # Mistral, Phi-3: every layer, where the config has a window
        layers = list(range(n_layers))
    if not window or window >= max_position or not layers:     # a window past the context is no window
        return 0, ()
    return window, tuple(layers)


def _gemma3(cfg: dict[str, Any], head_dim: int) -> dict[str, Any]:
    for name in ("final_logit_softcapping", "attn_logit_softcapping"):
        if cfg.get(name) is not None:
            raise UnsupportedModelError(f"Gemma 3 with {name}={cfg[name]} is not supported")
    if cfg.get("use_bidirectional_attention"):
        raise UnsupportedModelError("Gemma 3 with use_bidirectional_attention (an embedding model) is not supported")
    if cfg["hidden_activation"] != "gelu_pytorch_tanh":
        raise UnsupportedModelError(f"Gemma 3 with hidden_activation={cfg['hidden_activation']!r} is not supported")
    params = cfg.get("rope_parameters") or {}
    full = params.get("full_attention") or {**(cfg.get("rope_scaling") or {}), "rope_theta": cfg["rope_theta"]}
    local = params.get("sliding_attention") or {"rope_theta": cfg["rope_local_base_freq"]}
    if _rope(local, cfg, head_dim) is not None:
        raise UnsupportedModelError("Gemma 3 with RoPE scaling on its sliding layers is not supported")
    return {"qk_norm": True, "post_norms": True, "activation": "gelu_tanh", "embed_scale": cfg["hidden_size"] ** 0.5,
            "attn_scale": float(cfg["query_pre_attn_scalar"]) ** -0.5, "rope_theta": float(full["rope_theta"]),
            "rope_local_theta": float(local["rope_theta"]), "rope_scaling": _rope(full, cfg, head_dim)}


def config_from_hf(cfg: dict[str, Any], dtype: Dtype) -> ModelConfig:
    """The ModelConfig of a config.json. Raises UnsupportedModelError naming what is not supported."""
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        raise UnsupportedModelError(
            f"architecture {archs} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    family = ARCHITECTURES[arch]
    if arch == "Gemma3ForConditionalGeneration":        # the text model of a multimodal checkpoint
        cfg = {**cfg.get("text_config", {}),
               **{k: cfg[k] for k in ("eos_token_id", "bos_token_id") if cfg.get(k) is not None}}
    if family == "gemma3":
        cfg = {**GEMMA3_DEFAULTS, **{k: v for k, v in cfg.items() if v is not None}}
    act = cfg.get("hidden_act", "silu")
    if family != "gemma3" and act != "silu":
        raise UnsupportedModelError(f"{arch} with hidden_act={act!r} is not supported (only silu)")
    n_heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // n_heads)
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    partial = float(cfg.get("partial_rotary_factor") or rope.get("partial_rotary_factor") or 1.0)
    rotary_dim = int(head_dim * partial)
    n_layers, max_position = int(cfg["num_hidden_layers"]), int(cfg.get("max_position_embeddings", 2048))
    window, sliding = _windows(cfg, family, n_layers, max_position)
    eos = cfg.get("eos_token_id")
    extra = _gemma3(cfg, head_dim) if family == "gemma3" else {
        "rope_theta": float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
        "rope_scaling": _rope(rope, cfg, rotary_dim), "qk_norm": family == "qwen3"}
    return ModelConfig(
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
        intermediate_size=int(cfg["intermediate_size"]),
        head_dim=head_dim,
        rms_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        max_position=max_position,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", family == "qwen2")),
        dtype=dtype,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_id=eos[0] if isinstance(eos, list) else eos,
        family=family,
        sliding_window=window,
        sliding_layers=sliding,
        rotary_dim=rotary_dim,
        **extra,
    )


def read_hf_config(path: Path) -> dict[str, Any]:
    """An HF checkpoint folder's config.json, as a dict."""
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path / 'config.json'}: {exc}") from exc


def hf_config(path: Path, dtype: Dtype) -> ModelConfig:
    """The config of an HF checkpoint folder (its config.json)."""
    return config_from_hf(read_hf_config(path), dtype)


def hf_layout(config: ModelConfig, source: TensorSource) -> Layout:
    """Where an HF checkpoint of this family keeps its pieces: Gemma 3 stores w of (1 + w) in its
    norms, and a multimodal one keeps the decoder under a prefix (which of two, by transformers version)."""
    prefix = next((p for p in ("model.", "model.language_model.", "language_model.model.")
                   if source.has(p + "embed_tokens.weight")), "model.")
    return Layout(config, norm_shift=1.0 if config.family == "gemma3" else 0.0, prefix=prefix)


def load_hf_dir(path: Path, dtype: Dtype) -> tuple[ModelConfig, CheckpointReader]:
    """(config, a reader of its pieces) of an HF checkpoint directory."""
    from safetensors.torch import load_file

    config = hf_config(path, dtype)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors files in {path} (pytorch .bin checkpoints are not supported)")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(f)))
    source = StateDictSource(sd)
    return config, CheckpointReader(source, hf_layout(config, source))
