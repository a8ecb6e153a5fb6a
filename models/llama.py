"""The decoder of every supported family (Llama 2/3, SmolLM2, Mistral, Qwen2/3, Gemma 3, Phi-3) over a
paged KV cache; what differs between the families is data in ModelConfig (config.py says what).

Terms: T = packed new tokens, R = logit rows, H = query heads, Hkv = KV heads, G = H / Hkv,
D = head dim, E = hidden size, I = MLP size, V = vocabulary, L = one sequence's context length,
W = a sliding layer's window (keys a query sees, itself included).

Weights are held as fused float matrices (q/k/v in one, gate/up in one) — the form the weight
cache stores — and turned into Linear modules (float or int8, see linear.py) by `build`.
Everything outside the matmuls (residual stream, norms, RoPE, attention) runs in fp32 when the
weights are int8, and in the weight dtype otherwise.
"""
from __future__ import annotations

from typing import Self

import torch
import torch.nn.functional as F
from torch import nn

from interlock.kernels import native
from interlock.models.batch import ForwardBatch, SeqView, split_rows
from interlock.models.checkpoint import CheckpointReader, Layout, StateDictSource, fill
from interlock.models.config import ModelConfig
from interlock.models.kv_cache import _DTYPES, PagedKVCache
from interlock.models.linear import Int4Linear, Int8Linear, Projection, Weights, head_weights, make_linear
from interlock.models.rope import apply_rope, cos_sin_table, local_cos_sin_table

NATIVE_CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)      # the KV caches the native kernels read
# The gated MLP's gate functions (ModelConfig.activation): SwiGLU's SiLU, GeGLU's tanh-approximated GELU.
ACTIVATIONS = {"silu": F.silu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, use_native: bool = False) -> torch.Tensor:
    """RMSNorm computed in fp32 (as the reference implementations do), cast back to x's dtype.

    use_native: our kernel (kernels/native.py), for fp32 CPU activations; one op instead of torch's
    four-op decomposition, whose dispatch dominated a decode step's norms.
    """
    if use_native:
        return torch.ops.interlock_cpu.rms_norm(x, weight, eps)
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape), requires_grad=False)


def _project(linear: Projection, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
    """linear(x), with each prompt chunk through its own dense GEMM (see linear.py)."""
    if not batch.dense:
        return linear(x)
    parts = [(offset, linear.dense(x[offset: offset + n])) for offset, n in batch.dense]
    out = x.new_empty(x.shape[0], parts[0][1].shape[1], dtype=parts[0][1].dtype)
    for offset, y in parts:
        out[offset: offset + y.shape[0]] = y
    if batch.row_index is not None and batch.row_index.numel():
        out[batch.row_index] = linear(x[batch.row_index])
    return out


def _ones(n: int) -> nn.Parameter:
    return nn.Parameter(torch.ones(n), requires_grad=False)


def _ones_if(n: int, present: bool) -> nn.Parameter | None:
    return _ones(n) if present else None


def _kernel(linear: Projection) -> Int8Linear | Int4Linear | None:
    """The projection, where the fused rows path can take it (a native quantized kind)."""
    return linear if isinstance(linear, (Int8Linear, Int4Linear)) and linear.native else None


class Layer(nn.Module):
    # Declared for the type checker (nn.Module's attribute lookup types them Tensor | Module). The float
    # matrices are None once Linear modules hold the weights (Transformer.install).
    attention_norm: nn.Parameter
    wqkv: nn.Parameter | None
    bqkv: nn.Parameter | None
    q_norm: nn.Parameter | None
    k_norm: nn.Parameter | None
    wo: nn.Parameter | None
    post_attention_norm: nn.Parameter | None
    ffn_norm: nn.Parameter
    w13: nn.Parameter | None
    w2: nn.Parameter | None
    post_ffn_norm: nn.Parameter | None

    def matrix(self, name: str) -> nn.Parameter:
        """The float matrix `name` (wqkv, wo, w13, w2), which must still be here."""
        w = getattr(self, name)
        if w is None:
            raise RuntimeError(f"layer.{name} is gone: build() runs once, and a model made with matrices=False "
                               "takes its Linear modules from install()")
        return w

    def __init__(self, config: ModelConfig, matrices: bool = True) -> None:
        super().__init__()
        e, i, d = config.hidden_size, config.intermediate_size, config.head_dim
        qkv = config.q_size + 2 * config.kv_size
        param = _param if matrices else lambda *shape: None
        self.attention_norm = _ones(e)
        self.wqkv = param(qkv, e)
        self.bqkv = nn.Parameter(torch.zeros(qkv), requires_grad=False) if config.qkv_bias and matrices else None
        self.q_norm, self.k_norm = _ones_if(d, config.qk_norm), _ones_if(d, config.qk_norm)   # [D]: one per head dim
        self.wo = param(e, config.q_size)
        self.post_attention_norm = _ones_if(e, config.post_norms)
        self.ffn_norm = _ones(e)
        self.w13 = param(2 * i, e)          # gate rows, then up rows
        self.w2 = param(e, i)
        self.post_ffn_norm = _ones_if(e, config.post_norms)


class Transformer(nn.Module):
    """Weights plus the forward. Fill with `load_hf_state_dict` / `load_state_dict`, then `build()`."""

    # Declared for the type checker, as Layer's.
    tok_embeddings: nn.Parameter
    norm: nn.Parameter
    output: nn.Parameter | None
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    rope_cos_local: torch.Tensor | None
    rope_sin_local: torch.Tensor | None

    def __init__(self, config: ModelConfig, inv_freq: torch.Tensor | None = None, matrices: bool = True) -> None:
        """matrices=False: no float projection matrices (nor embedding storage): the caller installs
        ready Linear modules and the embedding (models/packed.py)."""
        super().__init__()
        self.config = config
        self.tok_embeddings = _param(*((config.vocab_size, config.hidden_size) if matrices else (0,)))
        self.layers = nn.ModuleList(Layer(config, matrices) for _ in range(config.n_layers))
        self.norm = nn.Parameter(torch.ones(config.hidden_size), requires_grad=False)
        self.output = None if config.tie_embeddings or not matrices else _param(config.vocab_size, config.hidden_size)
        cos, sin = cos_sin_table(config, inv_freq)
        self.register_buffer("rope_cos", cos, persistent=False)      # [P, R]: the global layers'
        self.register_buffer("rope_sin", sin, persistent=False)
        local = local_cos_sin_table(config)
        self.register_buffer("rope_cos_local", None if local is None else local[0], persistent=False)
        self.register_buffer("rope_sin_local", None if local is None else local[1], persistent=False)
        self.weights: Weights | None = None
        self.native = False             # the native CPU kernels for norms and row attention (build)
        self.fused_rows: dict[str, list[torch.Tensor]] | None = None     # rows_forward's weights (build)
        self.rows_prefill = False       # prompt chunks take rows_forward too (build)
        self._linears: list[dict[str, Projection]] = []
        self._head: Projection | None = None

    @property
    def dtype(self) -> torch.dtype:
        return _DTYPES[self.config.dtype]

    @property
    def act_dtype(self) -> torch.dtype:
        """dtype of the residual stream and attention."""
        return torch.float32 if self.weights in ("int8", "int4") else self.dtype

    def build(self, weights: Weights = "float") -> Self:
        """Create the Linear modules from the fused weights (int8 and int4 quantize them). Returns self."""
        linears = [
            {"wqkv": make_linear(layer.matrix("wqkv"), layer.bqkv, weights),
             "wo": make_linear(layer.matrix("wo"), None, weights),
             "w13": make_linear(layer.matrix("w13"), None, weights),
             "w2": make_linear(layer.matrix("w2"), None, weights)}
            for layer in self.layer_list()
        ]
        head = self.tok_embeddings if self.output is None else self.output
        return self.install(linears, make_linear(head, None, head_weights(weights)), weights)

    def install(self, linears: list[dict[str, Projection]], head: Projection, weights: Weights) -> Self:
        """Take ready Linear modules (build's, or models/packed.py's, made without float matrices)."""
        self._linears = linears
        self._head = head
        self.weights = weights
        self.native = self.act_dtype == torch.float32 and self.norm.device.type == "cpu" and native.available()
        self.fused_rows = self._fused_weights() if self.native and weights != "float" and self.FUSABLE else None
        self.rows_prefill = self.rows_prefill_default
        if weights != "float":     # the float matrices are no longer needed: drop them, keep the embedding
            for layer in self.layer_list():
                for name in ("wqkv", "wo", "w13", "w2"):
                    setattr(layer, name, None)
            if self.output is not None:
                self.output = None
            self.tok_embeddings.data = self.tok_embeddings.data.float()
        return self

    def layer_list(self, n_layers: int | None = None) -> list[Layer]:
        """The first n_layers layers (all by default), typed."""
        return [layer for layer in self.layers[:n_layers] if isinstance(layer, Layer)]

    @property
    def rows_prefill_default(self) -> bool:
        """Prompt chunks through the rows path too, where its many-row kernel runs SIMD code (AMX
        tiles, AVX512-VNNI or AVX2: at least as fast as the dense GEMMs at 256-token chunks on each,
        docs/performance.md): every token's bits are then the same however the prompt is chunked and
        whichever step computed it, so a prefix-cache hit can start at any block
        (EngineConfig.prefill), where the dense path can share only whole prompt chunks. That
        outweighs the dense path's closer fidelity to the checkpoint (docs/performance.md). The
        portable build's kernels are scalar: there the dense path stays the default."""
        return self.fused_rows is not None and native.simd_kernels()

    def set_dense_dtype(self, dtype: torch.dtype) -> None:
        """What the prompt-chunk GEMMs compute in (default: linear.dense_dtype()); the prefill
        benchmark sets bf16 and fp32 in turn to measure both in one run."""
        for lin in (*(m for d in self._linears for m in d.values()), self._head):
            if isinstance(lin, Int8Linear):       # the kind with a dense copy for prompt chunks
                lin.dense_dtype = dtype

    # The fused rows path (one native call for every layer) has no hooks for collectives: a
    # tensor-parallel subclass turns it off.
    FUSABLE = True

    def _fused_weights(self) -> dict[str, list[torch.Tensor]] | None:
        lin: list[dict[str, Int8Linear | Int4Linear]] = []
        for projections in self._linears:
            kernels = {name: _kernel(projections[name]) for name in ("wqkv", "wo", "w13", "w2")}
            ready = {name: k for name, k in kernels.items() if k is not None}
            if len(ready) < len(kernels):
                return None
            lin.append(ready)

        def norms(name: str) -> list[torch.Tensor]:      # empty where the family has no such norm
            return [getattr(x, name).float().contiguous() for x in self.layer_list() if getattr(x, name) is not None]

        return {
            "attn_norms": norms("attention_norm"), "ffn_norms": norms("ffn_norm"),
            "qkv_q": [l["wqkv"].kernel_weights[0] for l in lin], "qkv_s": [l["wqkv"].kernel_weights[1] for l in lin],
            "qkv_b": [b.float().contiguous() for l in lin if (b := l["wqkv"].bias) is not None],
            "o_q": [l["wo"].kernel_weights[0] for l in lin], "o_s": [l["wo"].kernel_weights[1] for l in lin],
            "up_q": [l["w13"].kernel_weights[0] for l in lin], "up_s": [l["w13"].kernel_weights[1] for l in lin],
            "down_q": [l["w2"].kernel_weights[0] for l in lin], "down_s": [l["w2"].kernel_weights[1] for l in lin],
            "q_norms": norms("q_norm"), "k_norms": norms("k_norm"),
            "post_attn_norms": norms("post_attention_norm"), "post_ffn_norms": norms("post_ffn_norm"),
        }

    # --- forward -----------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: PagedKVCache, *, n_layers: int | None = None,
                head: Projection | None = None) -> torch.Tensor:
        """Run one packed batch: write K/V of every new token, return fp32 logits [R, V].

        n_layers / head: run only the first n layers and this head instead (a layer-skip self-draft,
        or a pruned draft vocabulary); kv then needs only n_layers layers.
        """
        head = head or self._head
        if head is None:
            raise RuntimeError("call build() after loading weights")
        return self._logits(self.final_hidden(batch, kv, n_layers=n_layers), head)   # [R, V] fp32

    def final_hidden(self, batch: ForwardBatch, kv: PagedKVCache, *, n_layers: int | None = None) -> torch.Tensor:
        """forward without the head: the logit rows' hidden states after the final norm [R, E]."""
        if self.weights is None:
            raise RuntimeError("call build() after loading weights")
        dt = self.act_dtype
        if self.fused_rows is not None and kv.k.dtype in NATIVE_CACHE_DTYPES:
            x = self._hidden_fused(batch, kv, n_layers)
        else:
            x = self._hidden(batch, kv, n_layers)
        return rms_norm(x[batch.logit_index], self.norm.to(dt), self.config.rms_eps, self.native)

    @property
    def sparse_head(self) -> bool:
        """head_argmax runs here: the native rows path (no tensor parallelism) and an int8 head."""
        head = self._head
        return self.fused_rows is not None and isinstance(head, Int8Linear) and head.native and head.bias is None

    def head_argmax(self, x: torch.Tensor, bitmask: torch.Tensor, mask_rows: torch.Tensor,
                    vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy verification's (ids, peaks) for final_hidden rows x: native.masked_argmax of
        forward's logits, bit for bit, where rows whose grammar allows at most vocab / 16 ids
        compute only those logits, and rows marked -2 are skipped (kernels/csrc/head_argmax.h)."""
        head = self._head
        if not isinstance(head, Int8Linear):
            raise TypeError(f"head_argmax reads an int8 head, this model's is {type(head).__name__}")
        return torch.ops.interlock_cpu.head_argmax(x.contiguous(), head.qweight, head.scales_f32, bitmask,
                                                   mask_rows, vocab, max(1, vocab // 16))

    def _tables(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The RoPE tables [P, R]: the global one, then the sliding layers' own where the family has one."""
        cos, sin = self.rope_cos_local, self.rope_sin_local
        local = [] if cos is None or sin is None else [(cos, sin)]
        return [(self.rope_cos, self.rope_sin), *local]

    def _hidden(self, batch: ForwardBatch, kv: PagedKVCache, n_layers: int | None) -> torch.Tensor:
        """The layer loop in torch ops: hidden states [T, E] after n_layers layers."""
        c, dt, nat = self.config, self.act_dtype, self.native
        x = self._embed(batch.input_ids).to(dt) * c.embed_scale            # [T, E]
        ropes = [(cos[batch.positions].to(dt), sin[batch.positions].to(dt)) for cos, sin in self._tables()]
        act = ACTIVATIONS[c.activation]
        for index, (layer, lin) in enumerate(zip(self.layer_list(n_layers), self._linears[:n_layers])):
            h = rms_norm(x, layer.attention_norm.to(dt), c.rms_eps, nat)
            qkv = _project(lin["wqkv"], h, batch).to(dt)
            cos, sin = ropes[int(c.local_rope(index))]
            attn = self._attention(qkv, layer, cos, sin, batch, kv, index)
            x = x + self._post_norm(self._reduce(_project(lin["wo"], attn, batch)).to(dt), layer.post_attention_norm)
            h = rms_norm(x, layer.ffn_norm.to(dt), c.rms_eps, nat)
            gate, up = _project(lin["w13"], h, batch).to(dt).chunk(2, dim=-1)
            mlp = self._reduce(_project(lin["w2"], act(gate) * up, batch)).to(dt)
            x = x + self._post_norm(mlp, layer.post_ffn_norm)
        return x

    def _post_norm(self, y: torch.Tensor, weight: nn.Parameter | None) -> torch.Tensor:
        """Gemma 3's norm on a sublayer's output (after the all-reduce under TP); identity elsewhere."""
        return y if weight is None else rms_norm(y, weight.to(y.dtype), self.config.rms_eps, self.native)

    def _hidden_fused(self, batch: ForwardBatch, kv: PagedKVCache, n_layers: int | None) -> torch.Tensor:
        """Decode / verify rows (and prompt chunks, with rows_prefill) through one native call,
        other prompt chunks through the torch loop.

        A row's bits then never depend on whether a prompt chunk shared its step.
        """
        split = split_rows(batch, all_rows=self.rows_prefill if batch.all_rows is None else batch.all_rows)
        rows, row_index = split.rows, split.row_index
        x = torch.empty(batch.num_tokens, self.config.hidden_size, device=batch.input_ids.device)
        if split.dense is not None:
            x[split.dense_index] = self._hidden(split.dense, kv, n_layers)
        if rows:
            c, w = self.config, self.fused_rows
            assert w is not None, "final_hidden takes this path only with fused weights"
            n = c.n_layers if n_layers is None else n_layers
            positions = batch.positions[row_index]
            tables = self._tables()
            x[row_index] = torch.ops.interlock_cpu.rows_forward(
                (self._embed(batch.input_ids[row_index]).float() * c.embed_scale).contiguous(),
                [cos[positions].contiguous() for cos, _ in tables], [sin[positions].contiguous() for _, sin in tables],
                [int(c.local_rope(i)) for i in range(n)],
                batch.write_slots[row_index].contiguous(), [v.blocks for v in rows], [v.offset for v in rows],
                [v.length for v in rows], [v.start for v in rows], kv.k, kv.v,
                *(w[name][:n] for name in ("attn_norms", "ffn_norms", "qkv_q", "qkv_s", "qkv_b", "o_q", "o_s",
                                           "up_q", "up_s", "down_q", "down_s", "q_norms", "k_norms",
                                           "post_attn_norms", "post_ffn_norms")),
                [c.window(i) for i in range(n)], c.n_heads, c.n_kv_heads, c.rms_eps, c.attn_scale, c.activation,
                kv.block_size)
        return x

    # Hooks where a tensor-parallel rank (parallel/sharded.py) adds its collectives; identity here.

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok_embeddings[ids]

    def _reduce(self, y: torch.Tensor) -> torch.Tensor:
        """The output of a row-parallel projection (o, down): summed over ranks under TP."""
        return y

    def _logits(self, x: torch.Tensor, head: Projection) -> torch.Tensor:
        return head(x)

    def _head_norm(self, x: torch.Tensor, weight: nn.Parameter) -> torch.Tensor:
        """RMSNorm over each head's D dims (Qwen3 and Gemma 3's q/k norms): x [T, h, D]."""
        t, h, d = x.shape
        return rms_norm(x.reshape(t * h, d).contiguous(), weight.to(x.dtype), self.config.rms_eps,
                        self.native).view(t, h, d)

    def _attention(self, qkv: torch.Tensor, layer: Layer, cos: torch.Tensor, sin: torch.Tensor,
                   batch: ForwardBatch, kv: PagedKVCache, index: int) -> torch.Tensor:
        """qkv: [T, (H + 2 Hkv) D] -> attention output [T, H D]; writes this layer's K/V."""
        c = self.config
        t = qkv.shape[0]
        qk = qkv[:, : c.q_size + c.kv_size].reshape(t, c.n_heads + c.n_kv_heads, c.head_dim)
        if layer.q_norm is not None and layer.k_norm is not None:
            qk = torch.cat([self._head_norm(qk[:, : c.n_heads], layer.q_norm),
                            self._head_norm(qk[:, c.n_heads:], layer.k_norm)], dim=1)
        qk = apply_rope(qk, cos, sin)          # q and k in one go: they are adjacent      [T, H+Hkv, D]
        q, k = qk[:, : c.n_heads], qk[:, c.n_heads:]
        v = qkv[:, c.q_size + c.kv_size:]
        k_cache, v_cache = kv.k[index], kv.v[index]                       # [slots, Hkv, D]
        k_cache.index_copy_(0, batch.write_slots, k.to(k_cache.dtype))
        v_cache.index_copy_(0, batch.write_slots, v.reshape(t, c.n_kv_heads, c.head_dim).to(v_cache.dtype))
        window = c.window(index)
        out = [self._attend_seq(q, k_cache, v_cache, s, kv.block_size, window) for s in batch.seqs]
        return torch.cat(out) if len(out) > 1 else out[0]

    def _attend_seq(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    s: SeqView, block_size: int, window: int) -> torch.Tensor:
        """One sequence's rows; with a window W > 0, the query at position p sees keys p - W + 1 .. p."""
        c = self.config
        if s.mask is None and self.native and k_cache.dtype in NATIVE_CACHE_DTYPES:
            qs = q[s.offset: s.offset + s.length].contiguous()
            return torch.ops.interlock_cpu.row_attention(qs, k_cache, v_cache, s.blocks, block_size, s.start,
                                                         c.attn_scale, window)
        g = c.n_heads // c.n_kv_heads
        n_ctx = s.start + s.length
        if s.first_slot is not None:    # consecutive blocks (the usual case): a view, no copy
            keys = k_cache[s.first_slot: s.first_slot + n_ctx]
            values = v_cache[s.first_slot: s.first_slot + n_ctx]
        else:                           # gather whole blocks (one index per block), then trim to L
            keys = k_cache.view(-1, block_size, c.n_kv_heads, c.head_dim)[s.blocks]
            keys = keys.view(-1, c.n_kv_heads, c.head_dim)[:n_ctx]
            values = v_cache.view(-1, block_size, c.n_kv_heads, c.head_dim)[s.blocks]
            values = values.view(-1, c.n_kv_heads, c.head_dim)[:n_ctx]
        keys = keys.transpose(0, 1).to(q.dtype)                           # [Hkv, L, D]
        values = values.transpose(0, 1).to(q.dtype)
        qs = q[s.offset: s.offset + s.length]                             # [n, H, D]
        if s.mask is not None:                                            # prefill: fused kernel
            mask = s.mask
            if window:                                                    # and keys within the window
                pos = torch.arange(s.start, n_ctx, device=mask.device)
                mask = mask & (torch.arange(n_ctx, device=mask.device)[None, :] > pos[:, None] - window)
            # 4-D inputs: on the CPU only those reach the flash kernel (3-D ones take the math path).
            out = F.scaled_dot_product_attention(qs.transpose(0, 1)[None], keys[None], values[None],
                                                 attn_mask=mask, enable_gqa=g > 1, scale=c.attn_scale)[0]  # [H, n, D]
            return out.transpose(0, 1).reshape(s.length, c.q_size)
        # Row path: each query row attends over exactly its own keys with fixed-shape matmuls
        # (M = G), so a row's result does not depend on how many rows or sequences share the step.
        qs = (qs * c.attn_scale).view(s.length, c.n_kv_heads, g, c.head_dim)         # [n, Hkv, G, D]
        keys_t = keys.transpose(1, 2)                                                 # [Hkv, D, L]
        rows = []
        for r in range(s.length):
            end = s.start + r + 1
            lo = max(0, end - window) if window else 0
            rows.append(torch.matmul(torch.softmax(torch.matmul(qs[r], keys_t[:, :, lo:end]), dim=-1),
                                     values[:, lo:end]))                              # [Hkv, G, D]
        return torch.stack(rows).view(s.length, c.q_size)

    # --- weights -----------------------------------------------------------------------------

    def load_checkpoint(self, ckpt: CheckpointReader) -> None:
        """Copy every piece of a checkpoint into the fused weights (checkpoint.fill)."""
        fill(self, ckpt)

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor], norm_shift: float = 0.0) -> None:
        """load_checkpoint from HF-named tensors in memory (norm_shift: HF Gemma 3's 1, see checkpoint.py)."""
        self.load_checkpoint(CheckpointReader(StateDictSource(sd), Layout(self.config, norm_shift)))


def random_transformer(config: ModelConfig, seed: int = 0) -> Transformer:
    """Random weights, reproducible by seed: unit embeddings and norms, 1/sqrt(fan_in) matrices.

    The scale matters: with tiny matrices every layer is near identity and the model just repeats
    its last token, which would make speculative-decoding tests pass for the wrong reason.
    Call `build()` on the result.
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
