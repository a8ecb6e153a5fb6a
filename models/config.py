"""ModelConfig: the shape of a Llama-family decoder, with a tiny random-weight preset for tests."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from interlock.protocol.types import Dtype


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency-dependent RoPE scaling (`rope_type: llama3`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position: int


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Llama-family decoder (Llama 2/3, SmolLM, Mistral, Qwen2)."""

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

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.n_heads)
        for name in ("vocab_size", "hidden_size", "n_layers", "n_heads", "n_kv_heads", "intermediate_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"unsupported dtype {self.dtype!r}")
        if self.kv_dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(f"unsupported kv_dtype {self.kv_dtype!r}")

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

    def replace(self, **changes: object) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def tiny_config(vocab_size: int, *, dtype: Dtype = "float32") -> ModelConfig:
    """A 2-layer, hidden-64 decoder: fast enough for thousands of steps in a CPU test."""
    return ModelConfig(
        vocab_size=vocab_size, hidden_size=64, n_layers=2, n_heads=4, n_kv_heads=2,
        intermediate_size=128, rms_eps=1e-5, rope_theta=10000.0, max_position=4096,
        tie_embeddings=True, dtype=dtype,
    )
