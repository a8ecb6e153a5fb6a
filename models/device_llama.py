"""The device forward: the decoder of every family (config.py's data) over `StepInputs` tensors and the paged KV cache,
batch-invariant and graph-capturable. bf16 on CUDA; on the CPU (float32, torch reference ops)
it is what CI runs the CUDA engine's path with.

Terms as in llama.py (T rows = new tokens, E, H, Hkv, D, V), plus M = `gemm_rows`.

Why a second forward: llama.py's attention loops over sequences and rows in Python and its
batch shapes come from host lists, which suits a CPU but cannot be captured in a CUDA graph and
is not row-independent with cuBLAS. Here every input is a tensor in a `StepInputs` (fixed T), so
one forward is one fixed sequence of kernels, and each row's logits are bitwise the same whether
the row is decoded alone, in a verify chunk or next to other requests (greedy speculative ==
greedy plain, as on the CPU):

- matmuls: cuBLAS picks its kernel (tiles, split-K) from the shape, so a row's rounding can
  change with T. Every GEMM therefore runs on exactly M rows (T padded up to a multiple of M, one
  GEMM per M rows): same shape, same kernel, same per-row arithmetic. Cost: a decode step of one
  row does an M-row GEMM; decode GEMMs are bound by weight bytes, so M = 128 costs little
  (measured in benchmarks/gpu_bench.py: `invariant_cost`).
- RMSNorm and attention: Triton kernels with one program per row (models/triton_ops.py); on
  the CPU their torch references (models/reference_ops.py), row by row as well.
- everything else (embedding, RoPE, SiLU / tanh-GELU, residual adds, KV writes) is elementwise;
  per-head q/k norms are the same row RMSNorm over [T * heads, D].
`invariant=False` uses plain unpadded GEMMs and torch's RMSNorm, for measuring that cost.

Under tensor parallelism (`tp`, parallel/device_group.py) the weights are one rank's shard and the
forward adds its collectives: a vocab-parallel embedding, the sum of the row-parallel o and down
outputs, the gathered logits. With two ranks a sum of two partials is the same in either order,
so batch invariance holds there too.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from interlock.models.batch import SeqChunk
from interlock.models.config import ModelConfig
from interlock.models.kernel_rules import attention_blocks
from interlock.models.kv_cache import PagedKVCache, slots_of
from interlock.models.llama import ACTIVATIONS, Transformer
from interlock.models.rope import apply_rope, cos_sin_table, local_cos_sin_table
from interlock.protocol.errors import UnsupportedModelError


class Collectives(Protocol):
    """A tensor-parallel rank's part of the forward (parallel/device_group.py's ShardComm)."""

    vocab: int              # the whole vocabulary
    group: str              # the process group's registered name
    leader: Any             # rank 0's DeviceGroup, None on the other ranks

    def lead(self, inputs: StepInputs, kv: PagedKVCache, n_layers: int | None, head: torch.Tensor | None) -> None: ...
    def embed(self, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor: ...
    def reduce(self, y: torch.Tensor) -> torch.Tensor: ...
    def logits(self, local: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class StepInputs:
    """A forward's inputs as persistent device tensors: one row per new token (T rows), the block
    tables the rows read (one per sequence slot, kept on the device between steps), and the rows
    whose logits are wanted (N of them)."""

    input_ids: torch.Tensor     # [T] int64
    positions: torch.Tensor     # [T] int64
    write_slots: torch.Tensor   # [T] int64: KV slot each row writes
    row_table: torch.Tensor     # [T] int64: the row of `tables` that holds the row's block table
    tables: torch.Tensor        # [S, max blocks] int32: block tables (rows past a sequence's blocks unread)
    logit_rows: torch.Tensor    # [N] int64: rows whose logits the forward returns, in order

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]


def step_inputs(chunks: list[SeqChunk], kv: PagedKVCache, *, rows: int | None = None, max_blocks: int,
                pad_slot: int = 0, logit_rows: list[int] | None = None,
                device: torch.device | str = "cuda") -> StepInputs:
    """Host-side packing of chunks into `rows` rows (default: their token count), one block table per
    chunk; logits for `logit_rows` (default: every row).

    Padding rows decode token 0 at position 0 and write their K/V to `pad_slot` (a slot the
    caller keeps out of every sequence). Every chunk's positions must be reserved in `kv`.
    """
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    row_table: list[int] = []
    tables: list[list[int]] = []
    for i, c in enumerate(chunks):
        table = list(kv.block_table(c.seq))
        if len(table) > max_blocks:
            raise ValueError(f"sequence {c.seq} has {len(table)} blocks, more than max_blocks={max_blocks}")
        ids.extend(c.tokens)
        positions.extend(range(c.start, c.start + len(c.tokens)))
        slots.extend(slots_of(table, kv.block_size, c.start, len(c.tokens)))
        row_table.extend([i] * len(c.tokens))
        tables.append(table + [0] * (max_blocks - len(table)))
    n = len(ids) if rows is None else rows
    if n < len(ids):
        raise ValueError(f"{len(ids)} tokens do not fit in {n} rows")
    pad = n - len(ids)
    tables.append([pad_slot // kv.block_size] + [0] * (max_blocks - 1))
    wanted = list(range(n)) if logit_rows is None else logit_rows

    def tensor(values: list, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    return StepInputs(tensor(ids + [0] * pad), tensor(positions + [0] * pad), tensor(slots + [pad_slot] * pad),
                      tensor(row_table + [len(chunks)] * pad), tensor(tables, torch.int32), tensor(wanted))


@dataclass(frozen=True)
class _Layer:
    attention_norm: torch.Tensor
    wqkv: torch.Tensor
    bqkv: torch.Tensor | None
    wo: torch.Tensor
    ffn_norm: torch.Tensor
    w13: torch.Tensor
    w2: torch.Tensor
    q_norm: torch.Tensor | None = None              # [D] (Qwen3, Gemma 3)
    k_norm: torch.Tensor | None = None
    post_attention_norm: torch.Tensor | None = None  # [E] (Gemma 3)
    post_ffn_norm: torch.Tensor | None = None


class DeviceLlama:
    """Weights on one device and the forward over `StepInputs` (see the module docstring).

    `config` is the model's, with `dtype` and `kv_dtype` set to what this copy computes and caches in.
    """

    def __init__(self, config: ModelConfig, embed: torch.Tensor, layers: list[_Layer], norm: torch.Tensor,
                 head: torch.Tensor, *, gemm_rows: int = 128, invariant: bool = True,
                 rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                 rope_local: tuple[torch.Tensor, torch.Tensor] | None = None, tp: Collectives | None = None) -> None:
        if gemm_rows < 1:
            raise ValueError(f"gemm_rows must be >= 1, got {gemm_rows}")
        dtype = str(embed.dtype).removeprefix("torch.")
        # Under tensor parallelism the weights are one rank's shard (parallel/sharded.py's slicing:
        # heads, MLP rows, vocabulary rows) and `config` says so, but for the whole vocabulary:
        # the logits the forward returns are gathered whole.
        self.tp = tp
        self.config = config.replace(dtype=dtype, kv_dtype=dtype, **({"vocab_size": tp.vocab} if tp else {}))
        self.device = embed.device
        self.embed, self.layers, self.norm, self.head = embed, layers, norm, head
        self.gemm_rows = gemm_rows
        self.invariant = invariant
        attention_blocks(config.n_heads // config.n_kv_heads, config.head_dim)    # refuses what it cannot run, by name
        rope_local = rope_local if rope_local is not None else local_cos_sin_table(config)
        # [P, R] each: the global table, then the sliding layers' own where the family has one
        tables = (rope if rope is not None else cos_sin_table(config), rope_local)
        self.ropes = [tuple(t.to(embed.device, embed.dtype) for t in table) for table in tables if table is not None]

    @classmethod
    def from_transformer(cls, model: Transformer, device: torch.device | str = "cuda",
                         dtype: torch.dtype = torch.bfloat16, **kwargs: Any) -> DeviceLlama:
        """The same weights as a float-weight CPU Transformer (`build("float")`, or not built),
        rounded to `dtype` on `device`. Its RoPE table comes along (a GGUF may carry its own
        frequencies). Raises UnsupportedModelError for quantized weights: their float matrices are gone."""
        if model.weights not in (None, "float") or model.layer_list()[0].wqkv is None:
            raise UnsupportedModelError(f"the device forward needs float weights (load_model(..., weights='float')); "
                                        f"this model was built with {model.weights!r}")

        def to(t: torch.Tensor) -> torch.Tensor:
            return t.detach().to(device, dtype).contiguous()

        def maybe(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else to(t)

        layers = [_Layer(to(x.attention_norm), to(x.matrix("wqkv")), maybe(x.bqkv), to(x.matrix("wo")),
                         to(x.ffn_norm), to(x.matrix("w13")), to(x.matrix("w2")), maybe(x.q_norm), maybe(x.k_norm),
                         maybe(x.post_attention_norm), maybe(x.post_ffn_norm))
                  for x in model.layer_list()]
        head = model.tok_embeddings if model.output is None else model.output
        cos, sin = model.rope_cos_local, model.rope_sin_local
        local = None if cos is None or sin is None else (cos, sin)
        return cls(model.config, to(model.tok_embeddings), layers, to(model.norm), to(head),
                   rope=(model.rope_cos, model.rope_sin), rope_local=local, **kwargs)

    @classmethod
    def random(cls, config: ModelConfig, device: torch.device | str = "cuda", seed: int = 0,
               dtype: torch.dtype = torch.bfloat16, **kwargs: Any) -> DeviceLlama:
        """Random weights drawn on the device (no host copy of a multi-GB model), scaled as
        llama.random_transformer scales them: unit embeddings and norms, 1/sqrt(fan_in) matrices."""
        gen = torch.Generator(device=device).manual_seed(seed)

        def mat(rows: int, cols: int, scale: float) -> torch.Tensor:
            w = torch.randn(rows, cols, generator=gen, device=device, dtype=dtype)
            return w.mul_(scale)

        c = config
        e, i, qkv = c.hidden_size, c.intermediate_size, c.q_size + 2 * c.kv_size
        ones = torch.ones(e, device=device, dtype=dtype)
        qk = torch.ones(c.head_dim, device=device, dtype=dtype) if c.qk_norm else None
        post = ones if c.post_norms else None
        layers = [_Layer(ones, mat(qkv, e, e ** -0.5), None, mat(e, c.q_size, c.q_size ** -0.5), ones,
                         mat(2 * i, e, e ** -0.5), mat(e, i, i ** -0.5), qk, qk, post, post)
                  for _ in range(c.n_layers)]
        embed = mat(c.vocab_size, e, 1.0)
        head = embed if c.tie_embeddings else mat(c.vocab_size, e, 1.0)
        return cls(config, embed, layers, ones, head, **kwargs)

    def ops(self) -> ModuleType:
        """The row ops for this device: Triton on CUDA, the torch references elsewhere."""
        if self.device.type == "cuda":
            from interlock.models import triton_ops  # needs triton and a CUDA device

            return triton_ops
        from interlock.models import reference_ops

        return reference_ops

    @torch.inference_mode()
    def forward(self, inputs: StepInputs, kv: PagedKVCache, *, n_layers: int | None = None,
                head: torch.Tensor | None = None) -> torch.Tensor:
        """Write K/V of every row, return fp32 logits [N, V] of `inputs.logit_rows`. No host sync:
        capturable. The head, the forward's largest GEMM at a real vocabulary, runs on those rows only.

        n_layers: run the first n layers only (a self-draft; `kv` then holds n layers); head: another
        head's rows [Vd, E] (a pruned draft vocabulary)."""
        c, tp = self.config, self.tp
        ops = self.ops()
        norm = ops.rms_norm if self.invariant else _torch_rms_norm
        if tp is not None:
            tp.lead(inputs, kv, n_layers, head)       # rank 0: announce the forward, broadcast its inputs
        x = (self.embed[inputs.input_ids] if tp is None else tp.embed(self.embed, inputs.input_ids)) * c.embed_scale
        ropes = [(cos[inputs.positions], sin[inputs.positions]) for cos, sin in self.ropes]   # [T, R] each
        act = ACTIVATIONS[c.activation]
        for index, layer in enumerate(self.layers[:n_layers]):
            qkv = self._linear(norm(x, layer.attention_norm, c.rms_eps), layer.wqkv, layer.bqkv)
            attn = self._attention(qkv, layer, *ropes[int(c.local_rope(index))], inputs, kv, index, ops, norm)
            x = x + _maybe(norm, self._sum(self._linear(attn, layer.wo)), layer.post_attention_norm, c.rms_eps)
            gate, up = self._linear(norm(x, layer.ffn_norm, c.rms_eps), layer.w13).chunk(2, dim=-1)
            x = x + _maybe(norm, self._sum(self._linear(act(gate) * up, layer.w2)), layer.post_ffn_norm, c.rms_eps)
        x = x.index_select(0, inputs.logit_rows)                                   # [N, E]
        w = self.head if head is None else head
        logits = self._linear(norm(x, self.norm, c.rms_eps), w).float()         # [N, V] ([N, V/W] a shard's)
        return logits if tp is None else tp.logits(logits)

    def _sum(self, y: torch.Tensor) -> torch.Tensor:
        """A row-parallel projection's output: the ranks' partial sums added (one all-reduce)."""
        return y if self.tp is None else self.tp.reduce(y)

    __call__ = forward

    def _attention(self, qkv: torch.Tensor, layer: _Layer, cos: torch.Tensor, sin: torch.Tensor, inputs: StepInputs,
                   kv: PagedKVCache, index: int, ops: ModuleType, norm: Callable[..., torch.Tensor]) -> torch.Tensor:
        c = self.config
        t, heads = qkv.shape[0], c.n_heads + c.n_kv_heads
        qk = qkv[:, : c.q_size + c.kv_size].reshape(t, heads, c.head_dim)
        if layer.q_norm is not None and layer.k_norm is not None:        # per head: a row norm over [T * heads, D]
            q_part = norm(qk[:, : c.n_heads].reshape(-1, c.head_dim).contiguous(), layer.q_norm, c.rms_eps)
            k_part = norm(qk[:, c.n_heads:].reshape(-1, c.head_dim).contiguous(), layer.k_norm, c.rms_eps)
            qk = torch.cat([q_part.view(t, c.n_heads, -1), k_part.view(t, c.n_kv_heads, -1)], dim=1)
        qk = apply_rope(qk, cos, sin)
        q = qk[:, : c.n_heads].reshape(t, c.q_size).contiguous()                     # [T, H D]
        kv.k[index].index_copy_(0, inputs.write_slots, qk[:, c.n_heads:].to(kv.k.dtype))
        kv.v[index].index_copy_(0, inputs.write_slots,
                                qkv[:, c.q_size + c.kv_size:].reshape(t, c.n_kv_heads, c.head_dim).to(kv.v.dtype))
        return ops.paged_attention(q, kv.k[index], kv.v[index], inputs.tables, inputs.row_table, inputs.positions,
                                   c.n_kv_heads, kv.block_size, c.attn_scale, c.window(index))

    def _linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, in] @ w.T: one GEMM per M rows, padded to exactly M (see the module docstring)."""
        if not self.invariant:
            return F.linear(x, w, b)
        t, m = x.shape[0], self.gemm_rows
        padded = -(-t // m) * m
        if padded != t:
            x = torch.cat([x, x.new_zeros(padded - t, x.shape[1])])
        out = torch.cat([F.linear(x[i: i + m], w, b) for i in range(0, padded, m)]) if padded > m else F.linear(x, w, b)
        return out[:t]


def _maybe(norm, y: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Gemma 3's norm on a sublayer's output; y itself where the family has none."""
    return y if weight is None else norm(y.contiguous(), weight, eps)


def _torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
