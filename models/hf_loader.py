"""Read an HF checkpoint directory: config.json plus *.safetensors (sharded or not)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from interlock.models.config import ModelConfig, RopeScaling
from interlock.protocol.errors import ModelLoadError, UnsupportedModelError
from interlock.protocol.types import Dtype

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


def config_from_hf(cfg: dict, dtype: Dtype) -> ModelConfig:
    archs = cfg.get("architectures") or []
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise UnsupportedModelError(
            f"architecture {archs} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    scaling = None
    if rope_type == "llama3":
        scaling = RopeScaling(factor=float(rope["factor"]), low_freq_factor=float(rope["low_freq_factor"]),
                              high_freq_factor=float(rope["high_freq_factor"]),
                              original_max_position=int(rope["original_max_position_embeddings"]))
    elif rope_type not in ("default", None):
        raise UnsupportedModelError(f"RoPE scaling type {rope_type!r} is not supported")
    n_heads = int(cfg["num_attention_heads"])
    qwen = "Qwen2ForCausalLM" in archs
    return ModelConfig(
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        n_layers=int(cfg["num_hidden_layers"]),
        n_heads=n_heads,
        n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
        intermediate_size=int(cfg["intermediate_size"]),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // n_heads),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        rope_theta=float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
        rope_scaling=scaling,
        max_position=int(cfg.get("max_position_embeddings", 2048)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", qwen)),
        dtype=dtype,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_id=cfg["eos_token_id"][0] if isinstance(cfg.get("eos_token_id"), list) else cfg.get("eos_token_id"),
    )


def hf_config(path: Path, dtype: Dtype) -> ModelConfig:
    """The config of an HF checkpoint folder (its config.json)."""
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path / 'config.json'}: {exc}") from exc
    return config_from_hf(cfg, dtype)


def load_hf_dir(path: Path, dtype: Dtype) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    config = hf_config(path, dtype)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors files in {path} (pytorch .bin checkpoints are not supported)")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(f)))
    return config, sd
