"""Where each weight of the forward lives in a checkpoint, family by family, and how to read it.

Terms as in llama.py (E, H, Hkv, D, I, V). A *piece* is one weight the forward holds, unfused:
"embed", "norm", "output" and, per layer, "attention_norm", "q", "k", "v" (+ "q_bias", "k_bias",
"v_bias"), "q_norm", "k_norm", "o", "post_attention_norm", "ffn_norm", "gate", "up", "down",
"post_ffn_norm". `Layout` says, for a config, which checkpoint tensor (HF names) holds a piece and
at which row; `CheckpointReader` reads pieces, or slices of them (a tensor-parallel rank's part),
from any `TensorSource`. So the eager loader (llama.py `load_checkpoint`) and the sharded one
(parallel/sharded.py) share one table, and the families' layouts differ only here:

- Phi-3 fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj`: a piece is a row range of those;
- Gemma 3 has four norms a layer, named so that "post_attention_layernorm" (Llama's pre-MLP norm)
  is its norm *after* attention, and stores each norm weight as w of `(1 + w)`: `norm_shift` = 1 adds
  the one on reading (llama.cpp's GGUF files store 1 + w already: shift 0 there);
- Gemma 3's multimodal checkpoints (4B and up) keep the text model under a prefix.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from interlock.models.config import ModelConfig

LAYER_PIECES = ("attention_norm", "q", "k", "v", "q_bias", "k_bias", "v_bias", "q_norm", "k_norm", "o",
                "post_attention_norm", "ffn_norm", "gate", "up", "down", "post_ffn_norm")
NORMS = ("norm", "attention_norm", "ffn_norm", "post_attention_norm", "post_ffn_norm", "q_norm", "k_norm")


class TensorSource(Protocol):
    """Reads slices of a checkpoint's tensors (HF names) without materialising the others' parts."""

    def has(self, name: str) -> bool: ...

    def rows(self, name: str, lo: int, hi: int) -> torch.Tensor:
        """Rows [lo, hi) of a matrix (or elements of a vector), fp32; rows past the end are absent."""
        ...

    def cols(self, name: str, lo: int, hi: int) -> torch.Tensor:
        """Columns [lo, hi) of a matrix, fp32."""
        ...


class StateDictSource:
    """Full tensors already in memory (HF names)."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state

    def has(self, name: str) -> bool:
        return name in self.state

    def rows(self, name: str, lo: int, hi: int) -> torch.Tensor:
        return self.state[name][lo:hi].float()

    def cols(self, name: str, lo: int, hi: int) -> torch.Tensor:
        return self.state[name][:, lo:hi].float()


@dataclass(frozen=True)
class Layout:
    """Which tensor and row each piece is at, for `config`'s family."""

    config: ModelConfig
    norm_shift: float = 0.0         # added to every norm weight as read (HF Gemma 3: 1)
    prefix: str = "model."          # of the decoder's tensors ("model.language_model." in a multimodal Gemma 3)

    def where(self, piece: str, layer: int | None = None) -> tuple[str, int]:
        """(tensor name, first row) of a piece."""
        c = self.config
        if layer is None:
            names = {"embed": self.prefix + "embed_tokens.weight", "norm": self.prefix + "norm.weight",
                     "output": "lm_head.weight"}
            return names[piece], 0
        p = f"{self.prefix}layers.{layer}."
        if c.family == "phi3" and piece in ("q", "k", "v", "gate", "up"):
            offsets = {"q": 0, "k": c.q_size, "v": c.q_size + c.kv_size, "gate": 0, "up": c.intermediate_size}
            return p + ("self_attn.qkv_proj.weight" if piece in "qkv" else "mlp.gate_up_proj.weight"), offsets[piece]
        names = {
            "attention_norm": "input_layernorm.weight",
            # Gemma 3 names its pre-MLP norm apart; "post_attention_layernorm" is then the norm after attention
            "ffn_norm": "pre_feedforward_layernorm.weight" if c.post_norms else "post_attention_layernorm.weight",
            "post_attention_norm": "post_attention_layernorm.weight",
            "post_ffn_norm": "post_feedforward_layernorm.weight",
            "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
            "o": "self_attn.o_proj.weight", "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight",
            "down": "mlp.down_proj.weight",
        }
        if piece in ("q", "k", "v"):
            return p + f"self_attn.{piece}_proj.weight", 0
        if piece in ("q_bias", "k_bias", "v_bias"):
            return p + f"self_attn.{piece[0]}_proj.bias", 0
        return p + names[piece], 0

    def size(self, piece: str) -> int:
        """Rows of a piece (elements of a vector)."""
        c = self.config
        sizes = {"embed": c.vocab_size, "output": c.vocab_size, "q": c.q_size, "q_bias": c.q_size,
                 "k": c.kv_size, "v": c.kv_size, "k_bias": c.kv_size, "v_bias": c.kv_size,
                 "q_norm": c.head_dim, "k_norm": c.head_dim, "gate": c.intermediate_size,
                 "up": c.intermediate_size}
        return sizes.get(piece, c.hidden_size)


class CheckpointReader:
    """Pieces (or row / column slices of them) of a checkpoint, as the forward holds them, fp32."""

    def __init__(self, source: TensorSource, layout: Layout) -> None:
        self.source = source
        self.layout = layout

    def has(self, piece: str, layer: int | None = None) -> bool:
        return self.source.has(self.layout.where(piece, layer)[0])

    def rows(self, piece: str, layer: int | None = None, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """Rows [lo, hi) of a piece (default: all of it)."""
        name, offset = self.layout.where(piece, layer)
        hi = self.layout.size(piece) if hi is None else hi
        out = self.source.rows(name, offset + lo, offset + hi)
        return out + self.layout.norm_shift if piece in NORMS and self.layout.norm_shift else out

    def cols(self, piece: str, layer: int | None, lo: int, hi: int) -> torch.Tensor:
        """Columns [lo, hi) of a whole matrix piece (the row-parallel o and down)."""
        name, offset = self.layout.where(piece, layer)
        if offset:
            raise ValueError(f"{piece} is part of a fused tensor: take its rows")
        return self.source.cols(name, lo, hi)


@torch.inference_mode()
def fill(model: Any, ckpt: CheckpointReader) -> None:
    """Copy every piece into a Transformer's fused weights (llama.py), in its dtype.
    Raises KeyError naming the first missing tensor."""
    dtype = model.dtype

    def take(piece: str, layer: int | None = None) -> torch.Tensor:
        return ckpt.rows(piece, layer).to(dtype)

    model.tok_embeddings.data = take("embed")
    model.norm.data = take("norm")
    if model.output is not None:
        model.output.data = take("output")
    for i, layer in enumerate(model.layer_list()):
        layer.matrix("wqkv").data = torch.cat([take(n, i) for n in "qkv"])
        if layer.bqkv is not None:
            layer.bqkv.data = torch.cat([take(f"{n}_bias", i) for n in "qkv"])
        layer.matrix("w13").data = torch.cat([take("gate", i), take("up", i)])
        layer.matrix("wo").data, layer.matrix("w2").data = take("o", i), take("down", i)
        for name in ("attention_norm", "ffn_norm", "q_norm", "k_norm", "post_attention_norm", "post_ffn_norm"):
            if getattr(layer, name) is not None:
                getattr(layer, name).data = take(name, i)


def state_of(model: Any) -> dict[str, torch.Tensor]:
    """A float Transformer's weights as the checkpoint tensors `Layout(model.config)` reads back
    (norm_shift 0: the norms as the forward multiplies by them)."""
    c = model.config
    layout = Layout(c)
    pieces: dict[tuple[str, int | None], torch.Tensor] = {("embed", None): model.tok_embeddings.data,
                                                          ("norm", None): model.norm.data}
    if model.output is not None:
        pieces["output", None] = model.output.data
    for i, layer in enumerate(model.layer_list()):
        q, k, v = layer.matrix("wqkv").data.split([c.q_size, c.kv_size, c.kv_size])
        gate, up = layer.matrix("w13").data.chunk(2)
        pieces.update({("q", i): q, ("k", i): k, ("v", i): v, ("o", i): layer.matrix("wo").data,
                       ("gate", i): gate, ("up", i): up, ("down", i): layer.matrix("w2").data,
                       ("attention_norm", i): layer.attention_norm.data, ("ffn_norm", i): layer.ffn_norm.data})
        if layer.bqkv is not None:
            bq, bk, bv = layer.bqkv.data.split([c.q_size, c.kv_size, c.kv_size])
            pieces.update({("q_bias", i): bq, ("k_bias", i): bk, ("v_bias", i): bv})
        for name in ("q_norm", "k_norm", "post_attention_norm", "post_ffn_norm"):
            if getattr(layer, name) is not None:
                pieces[name, i] = getattr(layer, name).data
    state: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for (piece, index), t in pieces.items():
        name, offset = layout.where(piece, index)
        state.setdefault(name, []).append((offset, t))
    return {name: torch.cat([t for _, t in sorted(parts, key=lambda p: p[0])]) for name, parts in state.items()}
