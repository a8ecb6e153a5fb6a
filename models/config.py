"""ModelConfig: the shape of a decoder and its family's differences, as data; tiny presets for tests.

The families (docs/models.md) differ in a handful of numbers and switches that the forward reads
(models/llama.py), never in code paths named after a family:
- qk_norm: an RMSNorm over each query and key head before RoPE (Qwen3, Gemma 3);
- post_norms: norms on the attention and MLP outputs before each residual add (Gemma 3);
- activation: the gated MLP's gate function, SiLU (SwiGLU) or tanh-GELU (Gemma 3's GeGLU);
- embed_scale, attn_scale: the embedding multiplier (Gemma 3: sqrt(hidden)) and the softmax scale
  of q . k (Gemma 3: query_pre_attn_scalar ** -0.5);
- sliding_window / sliding_layers: layers whose queries see only their last `sliding_window` keys
  (Gemma 3's local layers, Phi-3's every layer), with their own RoPE base where rope_local_theta is set;
- rotary_dim and rope_scaling: partial rotary (Phi-4-mini) and llama3 / linear / longrope scaling.
How checkpoints lay out each family's tensors is models/checkpoint.py's.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from interlock.protocol.types import Dtype

Activation: TypeAlias = Literal["silu", "gelu_tanh"]
RopeKind: TypeAlias = Literal["llama3", "linear", "longrope"]
FAMILIES = ("llama", "qwen2", "qwen3", "gemma3", "phi3")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling (models/rope.py computes it).

    llama3: long wavelengths slowed by `factor`, short ones kept, the band between blended.
    linear: every frequency divided by `factor` (Gemma 3's global layers).
    longrope: per-frequency divisors, `short_factor` below `original_max_position` and
    `long_factor` from it on (Phi-3 / Phi-4-mini), cos and sin scaled by `attention_factor`.
    """

    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 0
    kind: RopeKind = "llama3"
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ("llama3", "linear", "longrope"):
            raise ValueError(f"unknown RoPE scaling kind {self.kind!r}")
        if self.kind == "longrope" and (not self.short_factor or len(self.short_factor) != len(self.long_factor)):
            raise ValueError("longrope needs short_factor and long_factor of the same length")
        object.__setattr__(self, "short_factor", tuple(float(f) for f in self.short_factor))
        object.__setattr__(self, "long_factor", tuple(float(f) for f in self.long_factor))


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a decoder of one of FAMILIES (the module docstring says what differs)."""

    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    head_dim: int = 0                       # 0 means hidden_size // n_heads
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position: int = 2048
    tie_embeddings: bool = False
    qkv_bias: bool = False                  # Qwen2
    dtype: Dtype = "float32"
    kv_dtype: Dtype | None = None           # the KV cache's; None: dtype
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    family: str = "llama"
    qk_norm: bool = False
    post_norms: bool = False
    activation: Activation = "silu"
    embed_scale: float = 1.0
    attn_scale: float = 0.0                 # 0 means head_dim ** -0.5
    sliding_window: int = 0                 # keys a sliding layer's query sees, itself included; 0: none
    sliding_layers: tuple[int, ...] = ()    # the layers that slide
    rope_local_theta: float = 0.0           # the sliding layers' RoPE base, unscaled; 0: they share the global RoPE
    rotary_dim: int = 0                     # dims of each head RoPE rotates (the first ones); 0 means head_dim

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.n_heads)
        if self.attn_scale == 0.0:
            object.__setattr__(self, "attn_scale", self.head_dim ** -0.5)
        if self.rotary_dim == 0:
            object.__setattr__(self, "rotary_dim", self.head_dim)
        object.__setattr__(self, "sliding_layers", tuple(int(i) for i in self.sliding_layers))
        for name in ("vocab_size", "hidden_size", "n_layers", "n_heads", "n_kv_heads", "intermediate_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2 or self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ValueError(f"RoPE needs an even rotary_dim <= head_dim, got {self.rotary_dim} of {self.head_dim}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"unsupported dtype {self.dtype!r}")
        if self.kv_dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(f"unsupported kv_dtype {self.kv_dtype!r}")
        if self.family not in FAMILIES:
            raise ValueError(f"unknown family {self.family!r} (known: {', '.join(FAMILIES)})")
        if self.activation not in ("silu", "gelu_tanh"):
            raise ValueError(f"unknown activation {self.activation!r}")
        if self.sliding_window < 0 or any(not 0 <= i < self.n_layers for i in self.sliding_layers):
            raise ValueError(f"sliding_window must be >= 0 and sliding_layers in 0..{self.n_layers - 1}")
        if self.sliding_layers and not self.sliding_window:
            raise ValueError("sliding_layers need a sliding_window")

    @property
    def cache_dtype(self) -> Dtype:
        """dtype of the K/V the cache stores (models/kv_cache.py)."""
        return self.kv_dtype or self.dtype

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.head_dim

    def window(self, layer: int) -> int:
        """Keys a query of `layer` sees (itself included): sliding_window on a sliding layer, else 0 (all)."""
        return self.sliding_window if layer in self.sliding_layers else 0

    def local_rope(self, layer: int) -> bool:
        """Whether `layer` rotates with the local table (rope_local_theta) instead of the global one."""
        return self.rope_local_theta > 0 and layer in self.sliding_layers

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def first_layers(self, n: int) -> ModelConfig:
        """The config of this model's first n layers (a layer-skip self-draft's, and its KV cache's)."""
        return self.replace(n_layers=n, sliding_layers=tuple(i for i in self.sliding_layers if i < n))


def tiny_config(vocab_size: int, *, dtype: Dtype = "float32") -> ModelConfig:
    """A 2-layer, hidden-64 decoder: fast enough for thousands of steps in a CPU test."""
    return ModelConfig(
        vocab_size=vocab_size, hidden_size=64, n_layers=2, n_heads=4, n_kv_heads=2,
        intermediate_size=128, rms_eps=1e-5, rope_theta=10000.0, max_position=4096,
        tie_embeddings=True, dtype=dtype,
    )
