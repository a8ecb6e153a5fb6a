"""The Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2) over a paged KV cache.

Terms: T = packed new tokens, B = sequences, Q/K = padded query/context length (see batch.py),
H = query heads, Hkv = KV heads, D = head dim, E = hidden size, I = MLP size, V = vocabulary.

Q/K/V and gate/up projections are fused into one matrix each, so a layer is four matmuls.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from interlock.models.batch import ForwardBatch
from interlock.models.config import ModelConfig
from interlock.models.kv_cache import _DTYPES, PagedKVCache
from interlock.models.rope import apply_rope, cos_sin_table, inv_frequencies


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in fp32 (as the reference implementations do), cast back to x's dtype."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class Layer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        e, i = config.hidden_size, config.intermediate_size
        qkv = config.q_size + 2 * config.kv_size
        self.attention_norm = nn.Parameter(torch.ones(e), requires_grad=False)
        self.wqkv = nn.Parameter(torch.empty(qkv, e), requires_grad=False)
        self.bqkv = nn.Parameter(torch.zeros(qkv), requires_grad=False) if config.qkv_bias else None
        self.wo = nn.Parameter(torch.empty(e, config.q_size), requires_grad=False)
        self.ffn_norm = nn.Parameter(torch.ones(e), requires_grad=False)
        self.w13 = nn.Parameter(torch.empty(2 * i, e), requires_grad=False)   # gate rows, then up rows
        self.w2 = nn.Parameter(torch.empty(e, i), requires_grad=False)


class Transformer(nn.Module):
    """Weights plus the forward. Build with `Transformer(config)` and `load_hf_state_dict`."""

    def __init__(self, config: ModelConfig, inv_freq: torch.Tensor | None = None) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Parameter(torch.empty(config.vocab_size, config.hidden_size), requires_grad=False)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.n_layers))
        self.norm = nn.Parameter(torch.ones(config.hidden_size), requires_grad=False)
        self.output = (None if config.tie_embeddings else
                       nn.Parameter(torch.empty(config.vocab_size, config.hidden_size), requires_grad=False))
        cos, sin = cos_sin_table(config, inv_freq)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @property
    def head(self) -> torch.Tensor:
        return self.tok_embeddings if self.output is None else self.output

    @property
    def dtype(self) -> torch.dtype:
        return _DTYPES[self.config.dtype]

    # --- forward -----------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: PagedKVCache) -> torch.Tensor:
        """Run one packed batch: write K/V of every new token, return fp32 logits [R, V]."""
        x = self.tok_embeddings[batch.input_ids]                          # [T, E]
        cos = self.rope_cos[batch.positions].to(x.dtype)                  # [T, D]
        sin = self.rope_sin[batch.positions].to(x.dtype)
        for index, layer in enumerate(self.layers):
            x = x + self._attention(layer, rms_norm(x, layer.attention_norm, self.config.rms_eps),
                                    cos, sin, batch, kv, index)
            x = x + self._mlp(layer, rms_norm(x, layer.ffn_norm, self.config.rms_eps))
        x = rms_norm(x[batch.logit_index], self.norm, self.config.rms_eps)  # [R, E]
        return F.linear(x, self.head).float()                            # [R, V]

    def _attention(self, layer: Layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   batch: ForwardBatch, kv: PagedKVCache, index: int) -> torch.Tensor:
        c = self.config
        t = h.shape[0]
        qkv = F.linear(h, layer.wqkv, layer.bqkv)                          # [T, H*D + 2*Hkv*D]
        q, k, v = qkv.split((c.q_size, c.kv_size, c.kv_size), dim=-1)
        q = apply_rope(q.view(t, c.n_heads, c.head_dim), cos, sin)        # [T, H, D]
        k = apply_rope(k.view(t, c.n_kv_heads, c.head_dim), cos, sin)     # [T, Hkv, D]
        k_cache, v_cache = kv.k[index], kv.v[index]                       # [N*S, Hkv, D]
        k_cache.index_copy_(0, batch.write_slots, k)
        v_cache.index_copy_(0, batch.write_slots, v.view(t, c.n_kv_heads, c.head_dim))

        b, qn = batch.num_seqs, batch.max_new
        keys = k_cache[batch.kv_index].transpose(1, 2)                    # [B, Hkv, K, D]
        values = v_cache[batch.kv_index].transpose(1, 2)
        if batch.pad_index is None:                                       # one sequence: no padding
            queries = q.view(1, qn, c.n_heads, c.head_dim).transpose(1, 2)  # [1, H, Q, D]
        else:
            padded = torch.cat([q, q.new_zeros(1, c.n_heads, c.head_dim)])[batch.pad_index]
            queries = padded.view(b, qn, c.n_heads, c.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=batch.mask,
                                             enable_gqa=c.n_heads != c.n_kv_heads)   # [B, H, Q, D]
        out = out.transpose(1, 2).reshape(b * qn, c.q_size)
        if batch.unpad_index is not None:
            out = out[batch.unpad_index]                                  # [T, H*D]
        return F.linear(out, layer.wo)

    def _mlp(self, layer: Layer, h: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(h, layer.w13).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, layer.w2)

    # --- weights -----------------------------------------------------------------------------

    @torch.inference_mode()
    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Copy weights named as in HF's LlamaForCausalLM / Qwen2ForCausalLM, fusing q/k/v and gate/up.

        Raises KeyError naming the first missing tensor.
        """
        dtype = self.dtype

        def take(name: str) -> torch.Tensor:
            return sd[name].to(dtype)

        self.tok_embeddings.data = take("model.embed_tokens.weight")
        self.norm.data = take("model.norm.weight")
        if self.output is not None:
            self.output.data = take("lm_head.weight")
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            layer.attention_norm.data = take(p + "input_layernorm.weight")
            layer.ffn_norm.data = take(p + "post_attention_layernorm.weight")
            layer.wqkv.data = torch.cat([take(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
            if layer.bqkv is not None:
                layer.bqkv.data = torch.cat([take(p + f"self_attn.{n}_proj.bias") for n in "qkv"])
            layer.wo.data = take(p + "self_attn.o_proj.weight")
            layer.w13.data = torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")])
            layer.w2.data = take(p + "mlp.down_proj.weight")


def random_transformer(config: ModelConfig, seed: int = 0) -> Transformer:
    """Random weights, reproducible by seed: unit embeddings and norms, 1/sqrt(fan_in) matrices.

    The scale matters: with tiny matrices every layer is near identity and the model just repeats
    its last token, which would make speculative-decoding tests pass for the wrong reason.
    """
    gen = torch.Generator().manual_seed(seed)
    model = Transformer(config)
    for name, p in model.named_parameters():
        if name.endswith("norm"):
            value = torch.ones(p.shape)
        elif p.dim() == 1:                                   # biases
            value = torch.randn(p.shape, generator=gen) * 0.1
        elif name in ("tok_embeddings", "output"):
            value = torch.randn(p.shape, generator=gen)
        else:
            value = torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5
        p.data = value.to(model.dtype)
    return model
