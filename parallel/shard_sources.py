"""Where a tensor-parallel rank reads its slices from (models/checkpoint.TensorSource), by checkpoint kind.

- GGUF: quantized rows are independent and a row's blocks cover 32 (or 256) consecutive inputs, so
  a row range or a block-aligned column range is sliced out of the memory-mapped bytes *before*
  dequantizing: a rank never dequantizes another rank's part.
- HF safetensors: `safe_open(...).get_slice` reads just the slice from the file.
- an in-memory state dict (the random "tiny" preset; tests).
Each is read through a CheckpointReader with its family's Layout, as the whole-model loaders read it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from interlock.models.config import ModelConfig, tiny_config
from interlock.models.checkpoint import CheckpointReader, Layout, StateDictSource, state_of
from interlock.models.gguf_loader import _PERMUTED_ARCHS, _ROPE_TENSORS, _field, hf_name, read_config, unpermute
from interlock.models.hf_loader import config_from_hf, hf_layout, read_hf_config
from interlock.models.llama import Transformer, random_transformer
from interlock.protocol.errors import ModelLoadError, UnsupportedModelError
from interlock.protocol.types import Dtype


def hf_state_of(model: Transformer) -> dict[str, torch.Tensor]:
    """A float Transformer's weights under the checkpoint names its Layout reads (checkpoint.state_of)."""
    return state_of(model)


class SafetensorsSource:
    """An HF checkpoint directory (one or several *.safetensors files)."""

    def __init__(self, path: Path) -> None:
        from safetensors import safe_open

        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(f"no *.safetensors files in {path}")
        self._handles = [safe_open(str(f), framework="pt") for f in files]
        self._where = {name: h for h in self._handles for name in h.keys()}

    def has(self, name: str) -> bool:
        return name in self._where

    def _slice(self, name: str) -> Any:
        if name not in self._where:
            raise KeyError(name)
        return self._where[name].get_slice(name)

    def rows(self, name: str, lo: int, hi: int) -> torch.Tensor:
        return self._slice(name)[lo:hi].float()

    def cols(self, name: str, lo: int, hi: int) -> torch.Tensor:
        return self._slice(name)[:, lo:hi].float()


class GGUFSource:
    """A GGUF file, memory-mapped; slices taken from the quantized bytes, then dequantized."""

    def __init__(self, reader: Any, n_heads: int, n_kv_heads: int) -> None:
        self.arch = _field(reader, "general.architecture")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self._tensors = {hf_name(self.arch, t.name): t for t in reader.tensors if t.name not in _ROPE_TENSORS}

    def has(self, name: str) -> bool:
        return name in self._tensors

    def _dequantize(self, t: Any, raw: np.ndarray) -> torch.Tensor:
        from gguf import quants

        w = np.array(quants.dequantize(raw, t.tensor_type), dtype=np.float32)
        return torch.from_numpy(np.ascontiguousarray(w))

    def rows(self, name: str, lo: int, hi: int) -> torch.Tensor:
        t = self._tensors[name]
        heads = None
        if self.arch in _PERMUTED_ARCHS and (".q_proj." in name or ".k_proj." in name):
            # The llama.cpp permutation is within each head: slice whole heads, un-permute those.
            total = self.n_heads if ".q_proj." in name else self.n_kv_heads
            per_head = t.data.shape[0] // total
            if lo % per_head or hi % per_head:
                raise UnsupportedModelError(f"{name}: rows {lo}..{hi} cut a head")
            heads = (hi - lo) // per_head
        w = self._dequantize(t, t.data[lo:hi])
        return torch.from_numpy(unpermute(w.numpy(), heads)) if heads else w

    def cols(self, name: str, lo: int, hi: int) -> torch.Tensor:
        from gguf import GGML_QUANT_SIZES

        t = self._tensors[name]
        if t.data.dtype != np.uint8:          # F32 / F16 / BF16: the reader gives the values themselves
            return self._dequantize(t, t.data[:, lo:hi])
        block, nbytes = GGML_QUANT_SIZES[t.tensor_type]
        if lo % block or hi % block:
            raise UnsupportedModelError(f"{name}: columns {lo}..{hi} are not aligned to its {block}-wide blocks")
        return self._dequantize(t, t.data[:, lo // block * nbytes: hi // block * nbytes])


def open_source(name_or_path: str, dtype: Dtype = "float32", seed: int = 0, config: ModelConfig | None = None
                ) -> tuple[ModelConfig, CheckpointReader, torch.Tensor | None]:
    """(config, a reader of its pieces, llama3 inv_freq or None) of a model name or path, as
    loader.load_model resolves it; only metadata is read here (the "tiny" preset's random weights excepted).

    config: the "tiny" preset's config when already known (saves reading the tokenizer for its eos id).
    """
    from interlock.models import loader

    if name_or_path == loader.TINY:
        if config is None:
            config = tiny_config(loader.TINY_PADDED_VOCAB, dtype=dtype)
            config = config.replace(eos_token_id=loader.load_tokenizer(loader.TINY).eos_token_ids[0])
        return config, CheckpointReader(StateDictSource(state_of(random_transformer(config, seed=seed))),
                                        Layout(config)), None
    path = loader.resolve(name_or_path)
    if path.suffix == ".gguf":
        from interlock.models.gguf_file import GGUFFile

        try:
            reader = GGUFFile(path)
        except (ValueError, OSError) as exc:
            raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from exc
        config, inv_freq = read_config(reader, dtype)
        return config, CheckpointReader(GGUFSource(reader, config.n_heads, config.n_kv_heads), Layout(config)), inv_freq
    config = config_from_hf(read_hf_config(path), dtype)
    source = SafetensorsSource(path)
    return config, CheckpointReader(source, hf_layout(config, source)), None
