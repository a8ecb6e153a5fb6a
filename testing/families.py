"""Tiny random-weight checkpoints of each family, built with transformers itself: the independent
implementation the family tests compare interlock against (no download: everything is made here).

`hf_model(name)` builds one (Qwen3ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM), `save_dir` writes
it as an HF checkpoint directory with the tiny preset's tokenizer, `write_gguf` writes the same
weights as a GGUF file laid out as llama.cpp's converter lays out that architecture.

The shapes keep what makes each family itself: Qwen3's head_dim apart from hidden / heads, Gemma 3's
local and global layers with a window short enough that test prompts cross it, Phi-3's fused
projections and window, Phi-4-mini's partial rotary and longrope past a short original context.
Weights are drawn at a scale where greedy decoding does not settle on one token: matrices with
1/sqrt(fan_in) entries, embeddings small beside what the layers add (with tied embeddings, large
ones make the model repeat its input token), norms that are not all ones.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:                   # transformers loads in seconds: only where a family is built
    from transformers import PreTrainedModel

VOCAB = 1088                 # the tiny preset's padded vocabulary (models/loader.py)
THINK = ("<think>", "</think>")
GEMMA3_EOT = 7               # the end-of-turn id the Gemma 3 GGUF names (tokenizer.ggml.eot_token_id)
# A ChatML template with Qwen3's thinking switch: enable_thinking=false closes an empty thought in the prompt.
QWEN3_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")

COMMON = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
          "tie_word_embeddings": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3": ("Qwen3ForCausalLM", {**COMMON, "head_dim": 32, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6}),
    # three layers, the last global; a window of 8 keys; a query_pre_attn_scalar apart from head_dim
    "gemma3": ("Gemma3ForCausalLM", {**COMMON, "num_hidden_layers": 3, "head_dim": 32, "sliding_window": 8,
                                     "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
                                     "query_pre_attn_scalar": 24, "rms_norm_eps": 1e-6,
                                     "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                            "rope_theta": 1_000_000.0},
                                                         "sliding_attention": {"rope_type": "default",
                                                                               "rope_theta": 10_000.0}}}),
    # as llama.cpp's gemma3 needs it: a global layer every 6th, query_pre_attn_scalar = head_dim
    "gemma3-gguf": ("Gemma3ForCausalLM", {**COMMON, "num_hidden_layers": 6, "head_dim": 32, "sliding_window": 8,
                                          "sliding_window_pattern": 6, "query_pre_attn_scalar": 32,
                                          "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0,
                                          "rope_local_base_freq": 10_000.0,
                                          "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "phi3": ("Phi3ForCausalLM", {**COMMON, "sliding_window": 16, "original_max_position_embeddings": 512,
                                 "rms_norm_eps": 1e-5}),
    # Phi-4-mini's shape of things: GQA, 3/4 of each head rotated, longrope past 32 positions
    "phi4-mini": ("Phi3ForCausalLM", {**COMMON, "hidden_size": 128, "original_max_position_embeddings": 32,
                                      "max_position_embeddings": 128, "partial_rotary_factor": 0.75,
                                      "rms_norm_eps": 1e-5, "rope_scaling": "longrope"}),
}
FAMILIES = ("qwen3", "gemma3", "phi3", "phi4-mini")


def hf_config(name: str) -> Any:
    import transformers

    arch, kw = CONFIGS[name]
    kw = dict(kw)
    if kw.get("rope_scaling") == "longrope":          # factors for 3/4 of head_dim 32: 12 of each
        gen = torch.Generator().manual_seed(7)
        kw["rope_scaling"] = {"rope_type": "longrope", "short_factor": (1 + torch.rand(12, generator=gen)).tolist(),
                              "long_factor": (1 + 3 * torch.rand(12, generator=gen)).tolist()}
    config_class = {"Qwen3ForCausalLM": "Qwen3Config", "Gemma3ForCausalLM": "Gemma3TextConfig",
                    "Phi3ForCausalLM": "Phi3Config"}[arch]
    config = getattr(transformers, config_class)(**kw)
    config.architectures = [arch]
    return config


@torch.no_grad()
def hf_model(name: str, seed: int = 0) -> PreTrainedModel:
    """A transformers model of the family with reproducible random weights, in float32, eval mode."""
    import transformers

    config = hf_config(name)
    torch.manual_seed(seed)
    model = getattr(transformers, config.architectures[0])(config).float().eval()
    gen = torch.Generator().manual_seed(seed)
    gemma = name.startswith("gemma")
    for pname, p in model.named_parameters():
        if pname.endswith("norm.weight"):      # Gemma stores w of (1 + w); the others w itself
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3 + (0.0 if gemma else 1.0))
        elif "embed_tokens" in pname:         # small beside the layers' outputs, or the model echoes its input
            p.copy_(torch.randn(p.shape, generator=gen) * (0.03 if gemma else 0.08))
        else:
            p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    return model


def save_dir(model: PreTrainedModel, path: Path, *, thinking: bool = False) -> Path:
    """The model as an HF checkpoint directory with the tiny preset's tokenizer (1024 ids); thinking:
    add <think> / </think> as special tokens and a Qwen3-style chat template with enable_thinking."""
    from interlock.models.loader import load_tokenizer

    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    hf = load_tokenizer("tiny").hf
    if thinking:
        hf.add_special_tokens({"additional_special_tokens": list(THINK)})
        hf.chat_template = QWEN3_TEMPLATE
    hf.save_pretrained(str(path))
    cfg = json.loads((path / "config.json").read_text())
    cfg["eos_token_id"] = hf.eos_token_id           # the tokenizer's: where the engine stops
    (path / "config.json").write_text(json.dumps(cfg))
    return path


# GGUF names of the HF tensors, as llama.cpp's converter writes them.
_GGUF_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
               "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}
_GGUF_NORMS = {"gemma3": {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                          "post_feedforward_layernorm": "post_ffw_norm"}}


def write_gguf(model: PreTrainedModel, path: Path, *, add_bos: bool | None = None) -> Path:
    """The model's weights as an F32 GGUF file of llama.cpp's architecture for it (qwen3, gemma3, phi3),
    with its metadata and a byte-level vocabulary of VOCAB tokens. add_bos: write
    `tokenizer.ggml.add_bos_token` (as Gemma's, Llama 3's and Mistral's files do) with BOS id 1;
    None writes no such key."""
    import gguf

    cfg = model.config
    arch = {"qwen3": "qwen3", "gemma3_text": "gemma3", "phi3": "phi3"}[cfg.model_type]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope = cfg.rope_parameters
    if arch == "qwen3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_freq_base(rope["rope_theta"])
    elif arch == "gemma3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_freq_base(rope["full_attention"]["rope_theta"])
        w.add_sliding_window(cfg.sliding_window)
        if rope["full_attention"]["rope_type"] == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rope["full_attention"]["factor"])
    else:
        rotary = int(head_dim * rope.get("partial_rotary_factor", 1.0))
        w.add_rope_dimension_count(rotary)
        w.add_rope_freq_base(rope["rope_theta"])
        w.add_sliding_window(cfg.sliding_window or 0)
        w.add_rope_scaling_orig_ctx_len(cfg.original_max_position_embeddings)
        if rope.get("rope_type") == "longrope":
            original = cfg.original_max_position_embeddings
            scale = cfg.max_position_embeddings / original
            w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(scale) / np.log(original))))
            w.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32))
            w.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32))
    w.add_tokenizer_model("gpt2")
    w.add_token_list([bytes([i]).decode("latin-1") for i in range(256)] + [f"<x{i}>" for i in range(VOCAB - 256)])
    w.add_token_types([1] * VOCAB)
    w.add_token_scores([0.0] * VOCAB)
    w.add_eos_token_id(2)
    if add_bos is not None:
        w.add_bos_token_id(1)
        w.add_add_bos_token(add_bos)
    if arch == "gemma3":
        w.add_eot_token_id(GEMMA3_EOT)              # <end_of_turn>'s role
    shift = 1.0 if arch == "gemma3" else 0.0         # llama.cpp stores Gemma's norms as 1 + w
    for name, t in model.state_dict().items():
        data = t.float().numpy()
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname, data = "output_norm.weight", data + shift
        elif name == "lm_head.weight":
            if cfg.tie_word_embeddings:
                continue
            gname = "output.weight"
        else:
            _, _, layer, module = name.split(".", 3)
            module = module.removesuffix(".weight")
            gname = _GGUF_NORMS.get(arch, {}).get(module) or _GGUF_LAYER.get(module) or {
                "post_attention_layernorm": "ffn_norm"}[module]
            gname = f"blk.{layer}.{gname}.weight"
            if module.endswith("norm"):
                data = data + shift
        w.add_tensor(gname, np.ascontiguousarray(data, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
