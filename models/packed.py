"""Quantized models (int8, int4) straight from a GGUF file, one tensor at a time, and the cache of
what their forward reads.

The float path (loader.py `_load_gguf_model`) dequantizes the whole file to an fp32 state dict
and quantizes again at every start: 4 bytes a weight in memory and on disk, ~45 s to start a 1B
model, more memory than a machine has at 8B. Here each projection goes from the file to the form
its kernel reads: Q4_0 / Q4_1 / Q4_K blocks to int4 without passing through floats
(kernels/int4_pack.py), any other tensor through its own floats only (a few hundred MB at 8B). The result
is saved per layer (torch.save) and read back memory-mapped, so a warm start maps files and reads
pages as the first steps touch them: no conversion, no copy.

Entries live under $XDG_CACHE_HOME/interlock/weights/q{FORMAT}-<kind>-<file key>/: config.json,
model.pt (embedding, final norm, head, RoPE frequencies) and layer-<i>.pt.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from interlock.models.checkpoint import CheckpointReader, Layout
from interlock.models.config import ModelConfig
from interlock.kernels.int4_pack import FROM_BLOCKS, from_gguf, quantize_int4
from interlock.models.linear import Int4Linear, Int8Linear, Projection, Weights, quantize_int8
from interlock.models.tokenizer import cache_dir, file_key
from interlock.models.weight_cache import config_from_json
from interlock.protocol.errors import ModelLoadError, UnsupportedModelError

FORMAT = 1
PROJECTIONS = {"wqkv": ("q", "k", "v"), "wo": ("o",), "w13": ("gate", "up"), "w2": ("down",)}


class GGUFSource:
    """A GGUF file's tensors by HF name (checkpoint.TensorSource), plus `packed`: rows of a matrix
    in the form a quantized projection's kernel reads."""

    def __init__(self, reader: Any, arch: str, config: ModelConfig) -> None:
        from interlock.models.gguf_loader import _ROPE_TENSORS, SUPPORTED_QUANTS, hf_name

        self.tensors = {hf_name(arch, t.name): t for t in reader.tensors if t.name not in _ROPE_TENSORS}
        for t in self.tensors.values():
            if t.tensor_type.name not in SUPPORTED_QUANTS:
                raise UnsupportedModelError(
                    f"tensor {t.name} uses quantization {t.tensor_type.name}, which is not supported "
                    f"(supported: {', '.join(SUPPORTED_QUANTS)}); re-quantize the GGUF (e.g. Q8_0 or Q4_K_M)")
        self.arch, self.config = arch, config

    def has(self, name: str) -> bool:
        return name in self.tensors

    def _heads(self, name: str) -> int | None:
        """The head count whose rows llama.cpp interleaved in this tensor (gguf_loader.unpermute)."""
        from interlock.models.gguf_loader import _PERMUTED_ARCHS

        if self.arch not in _PERMUTED_ARCHS:
            return None
        if ".self_attn.q_proj." in name:
            return self.config.n_heads
        return self.config.n_kv_heads if ".self_attn.k_proj." in name else None

    def _rows_of(self, name: str, data: np.ndarray) -> np.ndarray:
        from interlock.models.gguf_loader import unpermute

        heads = self._heads(name)
        return data if heads is None else unpermute(data, heads)

    def _blocks(self, name: str, lo: int, hi: int) -> tuple[np.ndarray, int]:
        """The stored data holding rows [lo, hi) and the row it starts at. A tensor llama.cpp
        permuted (rows interleaved per head) is read whole; any other only in the rows asked for,
        so a slice never dequantizes the rest (a 128k-row embedding, a fused qkv's other pieces)."""
        data = self.tensors[name].data
        if self._heads(name) is not None or data.ndim != 2:
            return data, 0
        return data[lo:hi], lo

    def _float(self, name: str, lo: int, hi: int) -> np.ndarray:
        from gguf import quants

        t = self.tensors[name]
        data, at = self._blocks(name, lo, hi)
        w = self._rows_of(name, np.asarray(quants.dequantize(data, t.tensor_type), dtype=np.float32))
        return w[lo - at:hi - at]

    def rows(self, name: str, lo: int, hi: int) -> torch.Tensor:
        return torch.from_numpy(np.array(self._float(name, lo, hi), dtype=np.float32))

    def cols(self, name: str, lo: int, hi: int) -> torch.Tensor:
        n = int(np.prod(self.tensors[name].shape[1:]))
        return torch.from_numpy(np.array(self._float(name, 0, n)[:, lo:hi], dtype=np.float32))

    def kind(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def int4(self, name: str, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows [lo, hi) as int4 (records, offsets): from the blocks where they are 4-bit."""
        t = self.tensors[name]
        if self.kind(name) not in FROM_BLOCKS:
            return quantize_int4(self._float(name, lo, hi))
        data, at = self._blocks(name, lo, hi)
        parts = from_gguf(data, self.kind(name), data.shape[0], int(t.shape[0]))
        records, offsets = (self._rows_of(name, a)[lo - at:hi - at] for a in parts)
        return np.ascontiguousarray(records), np.ascontiguousarray(offsets)


def _projection(src: GGUFSource, layout: Layout, layer: int, pieces: tuple[str, ...],
                weights: Weights) -> dict[str, torch.Tensor]:
    """One fused projection (its pieces' rows stacked) as its kernel reads it: {"q", "s"} = int4
    records and offsets (uint8 q), or int8 rows and their bf16 scales (int8 q). Under int4 a
    projection whose pieces are all stored in 4-bit blocks is int4, from those blocks; one with a
    piece the file keeps at more bits (a Q4_K_M file's Q6_K attn_v and ffn_down, Gemma 3's Q5_0) is
    int8, and so is one whose K is not a multiple of 64 (docs/models.md, "Weights")."""
    where = [(*layout.where(p, layer), layout.size(p)) for p in pieces]
    k = int(src.tensors[where[0][0]].shape[0])
    if weights == "int4" and k % 64 == 0 and all(src.kind(name) in FROM_BLOCKS for name, _, _ in where):
        parts = [src.int4(name, at, at + size) for name, at, size in where]
        q, s = (torch.from_numpy(np.concatenate(p)) for p in zip(*parts))
    else:
        q, s = quantize_int8(torch.cat([src.rows(name, at, at + size) for name, at, size in where]))
    return {"q": q, "s": s}


def _layer_state(ckpt: CheckpointReader, src: GGUFSource, layer: int, weights: Weights) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for name, pieces in PROJECTIONS.items():
        state |= {f"{name}.{part}": t for part, t in _projection(src, ckpt.layout, layer, pieces, weights).items()}
    if ckpt.has("q_bias", layer):
        state["wqkv.bias"] = torch.cat([ckpt.rows(f"{n}_bias", layer) for n in "qkv"])
    for norm in layer_norms(ckpt.layout.config):
        state[norm] = ckpt.rows(norm, layer)
    return state


def layer_norms(config: ModelConfig) -> tuple[str, ...]:
    """The norm weights a layer of this family holds (llama.py Layer)."""
    return ("attention_norm", "ffn_norm", *(("q_norm", "k_norm") if config.qk_norm else ()),
            *(("post_attention_norm", "post_ffn_norm") if config.post_norms else ()))


_CHUNK = 16384                  # rows of the embedding and head converted at a time


def _embedding(ckpt: CheckpointReader, config: ModelConfig) -> torch.Tensor:
    """The fp32 embedding, filled a chunk of rows at a time: no second whole copy is ever held."""
    out = torch.empty(config.vocab_size, config.hidden_size)
    for lo in range(0, config.vocab_size, _CHUNK):
        out[lo:lo + _CHUNK] = ckpt.rows("embed", lo=lo, hi=min(lo + _CHUNK, config.vocab_size))
    return out


def _head(ckpt: CheckpointReader, config: ModelConfig, embed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The head as int8 rows under both kinds (linear.head_weights), quantized a chunk of rows at a
    time (quantize_int8 is row by row, so the chunks give the same bits as the whole)."""
    q = torch.empty(config.vocab_size, config.hidden_size, dtype=torch.int8)
    s = torch.empty(config.vocab_size, dtype=torch.bfloat16)
    for lo in range(0, config.vocab_size, _CHUNK):
        hi = min(lo + _CHUNK, config.vocab_size)
        rows = embed[lo:hi] if config.tie_embeddings else ckpt.rows("output", lo=lo, hi=hi)
        q[lo:hi], s[lo:hi] = quantize_int8(rows)
    return q, s


def _linear(state: dict[str, torch.Tensor], name: str) -> Projection:
    q, s, bias = state[f"{name}.q"], state[f"{name}.s"], state.get(f"{name}.bias")
    return Int4Linear(q, s, bias) if q.dtype == torch.uint8 else Int8Linear.from_quantized(q, s, bias)


def _entry(path: Path, weights: Weights) -> Path:
    return cache_dir("weights", f"q{FORMAT}-{weights}-{file_key(path)}")


def cached_config(path: Path, weights: Weights) -> ModelConfig | None:
    try:
        return config_from_json(_entry(path, weights) / "config.json")
    except (OSError, json.JSONDecodeError):
        return None


def convert(path: Path, weights: Weights, progress: Any = None) -> Path:
    """Write the cache entry of `path` as `weights` (one layer in memory at a time); its folder."""
    from interlock.models.gguf_file import GGUFFile

    from interlock.models.gguf_loader import _field, read_config

    try:
        reader = GGUFFile(path)
    except (ValueError, OSError) as exc:
        raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from exc
    config, inv_freq = read_config(reader, "float32")
    src = GGUFSource(reader, _field(reader, "general.architecture"), config)
    ckpt = CheckpointReader(src, Layout(config))
    entry = _entry(path, weights)
    tmp = entry.with_name(f"{entry.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if progress is not None:
            progress(0, config.n_layers)
        top = {"embed": _embedding(ckpt, config), "norm": ckpt.rows("norm")}
        top["head.q"], top["head.s"] = _head(ckpt, config, top["embed"])
        if inv_freq is not None:
            top["inv_freq"] = inv_freq
        torch.save(top, tmp / "model.pt")
        del top
        reader.release()
        for i in range(config.n_layers):
            torch.save(_layer_state(ckpt, src, i, weights), tmp / f"layer-{i}.pt")
            reader.release()
            if progress is not None:
                progress(i + 1, config.n_layers)
        (tmp / "config.json").write_text(json.dumps(dataclasses.asdict(config)))
        shutil.rmtree(entry, ignore_errors=True)
        os.replace(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return entry


def load_quantized(path: Path, weights: Weights, dtype: str = "float32", progress: Any = None) -> Any:
    """The built Transformer of a GGUF as `weights` ("int8" or "int4"), converted on first use."""
    from interlock.models.llama import Transformer

    config = cached_config(path, weights)
    entry = _entry(path, weights)
    if config is None:
        convert(path, weights, progress)
        config = cached_config(path, weights)
        assert config is not None
    top = torch.load(entry / "model.pt", mmap=True, weights_only=True)
    model = Transformer(config.replace(dtype=dtype), top.get("inv_freq"), matrices=False)
    model.tok_embeddings = nn.Parameter(top["embed"], requires_grad=False)
    model.norm.data = top["norm"]
    linears = []
    for i, layer in enumerate(model.layers):
        state = torch.load(entry / f"layer-{i}.pt", mmap=True, weights_only=True)
        linears.append({name: _linear(state, name) for name in PROJECTIONS})
        for norm in layer_norms(config):
            getattr(layer, norm).data = state[norm]
    head = Int8Linear.from_quantized(top["head.q"], top["head.s"])
    return model.install(linears, head, weights)
