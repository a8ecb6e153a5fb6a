"""Tensor parallelism of the Llama forward: which slice of each weight a rank holds, and the forward
over those slices with the collectives between them (Megatron-style).

Terms: W = world size (ranks), r = this rank, H/Hkv/D/E/I/V as in llama.py; Hl = H / W, Hkvl = Hkv / W,
Il = I / W, Vl = ceil(V / W) (the last rank's vocabulary rows are zero-padded).

- column-parallel (output rows split): q/k/v by whole heads (rank r holds q heads [r Hl, (r+1) Hl) and
  the KV heads they read, so GQA groups never straddle ranks), gate/up by MLP rows;
- row-parallel (input columns split): o and down, whose partial outputs are summed by one all-reduce
  each per layer;
- vocab-parallel embedding (each rank looks up the ids it holds, an all-reduce adds the one non-zero
  row to the zeros) and head (each rank computes its Vl logits; rank 0 gathers them for sampling).

Batch invariance survives: an all-reduce adds the same W partials element by element whatever the
batch holds, so the forward is as row-independent as its local matmuls (exactly so with int8 weights).
TP=W equals TP=1 up to the order of the W partial sums in o and down (fp32 round-off with float weights).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
import torch
import torch.distributed as dist

from interlock.models.batch import ForwardBatch
from interlock.models.checkpoint import CheckpointReader
from interlock.models.config import ModelConfig
from interlock.models.kv_cache import PagedKVCache
from interlock.models.linear import Projection, Weights
from interlock.models.llama import Transformer
from interlock.protocol.errors import UnsupportedModelError


@dataclass(frozen=True)
class Shard:
    """Rank r of W; `check` says whether a model can be split W ways."""

    rank: int
    world: int

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} outside a world of {self.world}")

    def check(self, config: ModelConfig) -> None:
        """Raises UnsupportedModelError when heads, KV heads or the MLP width do not divide by W."""
        for name in ("n_heads", "n_kv_heads", "intermediate_size"):
            if getattr(config, name) % self.world:
                raise UnsupportedModelError(
                    f"tensor_parallel={self.world} does not divide {name}={getattr(config, name)}; "
                    f"choose a tensor-parallel size that divides the model's heads, KV heads and MLP width")

    def span(self, n: int) -> tuple[int, int]:
        """[lo, hi) of n items split W ways (n divisible by W)."""
        step = n // self.world
        return self.rank * step, (self.rank + 1) * step

    def vocab_span(self, vocab: int) -> tuple[int, int]:
        """[lo, hi) of the vocabulary rows this rank holds (hi may pass V: padding rows)."""
        step = -(-vocab // self.world)
        return self.rank * step, (self.rank + 1) * step


def local_config(config: ModelConfig, shard: Shard) -> ModelConfig:
    """The shape one rank's Transformer has: its heads, MLP rows and vocabulary rows."""
    shard.check(config)
    lo, hi = shard.vocab_span(config.vocab_size)
    return config.replace(n_heads=config.n_heads // shard.world, n_kv_heads=config.n_kv_heads // shard.world,
                          intermediate_size=config.intermediate_size // shard.world, vocab_size=hi - lo,
                          head_dim=config.head_dim)


def _pad_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    return t if t.shape[0] == n else torch.cat([t, t.new_zeros(n - t.shape[0], *t.shape[1:])])


@torch.no_grad()     # not inference_mode: weights made there are inference tensors, which index_select rejects later
def load_shard(ckpt: CheckpointReader, config: ModelConfig, shard: Shard, inv_freq: torch.Tensor | None = None,
               weights: Weights = "float") -> ShardedTransformer:
    """Rank `shard`'s slice of every weight, read from `ckpt`, built into a ShardedTransformer
    (its `group` is set by the caller once torch.distributed is up). Norms (q/k norms [D] included)
    are whole on every rank."""
    c = config
    local = local_config(c, shard)
    model = ShardedTransformer(local, shard, c.vocab_size, inv_freq)
    dtype = model.dtype
    d = c.head_dim
    h_lo, h_hi = shard.span(c.n_heads)
    kv_lo, kv_hi = shard.span(c.n_kv_heads)
    i_lo, i_hi = shard.span(c.intermediate_size)
    v_lo, v_hi = shard.vocab_span(c.vocab_size)

    def qkv(i: int, suffix: str) -> torch.Tensor:
        parts = [ckpt.rows("q" + suffix, i, h_lo * d, h_hi * d), ckpt.rows("k" + suffix, i, kv_lo * d, kv_hi * d),
                 ckpt.rows("v" + suffix, i, kv_lo * d, kv_hi * d)]
        return torch.cat(parts).to(dtype)

    model.tok_embeddings.data = _pad_rows(ckpt.rows("embed", None, v_lo, v_hi), v_hi - v_lo).to(dtype)
    model.norm.data = ckpt.rows("norm").to(dtype)
    if model.output is not None:
        model.output.data = _pad_rows(ckpt.rows("output", None, v_lo, v_hi), v_hi - v_lo).to(dtype)
    for i, layer in enumerate(model.layers):
        for name in ("attention_norm", "ffn_norm", "q_norm", "k_norm", "post_attention_norm", "post_ffn_norm"):
            if getattr(layer, name) is not None:
                getattr(layer, name).data = ckpt.rows(name, i).to(dtype)
        layer.wqkv.data = qkv(i, "")
        if layer.bqkv is not None:
            layer.bqkv.data = qkv(i, "_bias")
        layer.wo.data = ckpt.cols("o", i, h_lo * d, h_hi * d).to(dtype)
        layer.w13.data = torch.cat([ckpt.rows("gate", i, i_lo, i_hi), ckpt.rows("up", i, i_lo, i_hi)]).to(dtype)
        layer.w2.data = ckpt.cols("down", i, i_lo, i_hi).to(dtype)
    return model.build(weights)


class ShardedTransformer(Transformer):
    """One rank's Transformer: llama.py's forward with the all-reduces and the vocabulary gather.

    Every rank calls `forward` with the same batch (and its own KV cache, which holds its Hkvl heads);
    rank 0 returns the full [R, V] logits, the other ranks an empty tensor.
    """

    FUSABLE = False     # rows_forward runs every layer in one call, with no place for the all-reduces

    def __init__(self, config: ModelConfig, shard: Shard, vocab_size: int,
                 inv_freq: torch.Tensor | None = None) -> None:
        super().__init__(config, inv_freq)
        self.shard = shard
        self.full_vocab = vocab_size
        self.group: dist.ProcessGroup | None = None     # set once torch.distributed is initialised
        self.collective_s = 0.0                          # time spent in collectives (benchmarks read it)

    def forward(self, batch: ForwardBatch, kv: PagedKVCache, *, n_layers: int | None = None,
                head: Projection | None = None) -> torch.Tensor:
        if head is not None:
            raise UnsupportedModelError("a pruned draft head is not supported under tensor parallelism")
        return super().forward(batch, kv, n_layers=n_layers)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        lo = self.shard.rank * self.config.vocab_size
        local = ids - lo
        mine = (local >= 0) & (local < self.config.vocab_size)
        x = self.tok_embeddings[local.clamp(0, self.config.vocab_size - 1)] * mine[:, None]    # [T, E]
        return self._reduce(x)

    # c10d collectives bump version counters, which inference tensors lack: they work on normal
    # tensors made outside inference mode (one copy of an [T, E] activation per layer).

    def _reduce(self, y: torch.Tensor) -> torch.Tensor:
        if self.shard.world == 1:           # nothing to add; gloo would still hand off to its thread
            return y
        with torch.inference_mode(False):
            y = y.clone()
            start = time.perf_counter()
            dist.all_reduce(y, group=self.group)
            self.collective_s += time.perf_counter() - start
        return y

    def _logits(self, x: torch.Tensor, head: Projection) -> torch.Tensor:
        out = head(x)
        if self.shard.world == 1:
            return out[:, : self.full_vocab]
        with torch.inference_mode(False):
            local = out.clone()                                             # [R, Vl]
            parts = [torch.empty_like(local) for _ in range(self.shard.world)] if self.shard.rank == 0 else None
            start = time.perf_counter()
            dist.gather(local, parts, dst=0, group=self.group)
            self.collective_s += time.perf_counter() - start
        if parts is None:
            return local.new_empty(0)
        return torch.cat(parts, dim=1)[:, : self.full_vocab]               # [R, V]
