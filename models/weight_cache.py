"""On-disk cache of converted weights: dequantized, renamed and fused, as one safetensors file.

Parsing a GGUF file's metadata (tens of thousands of tokenizer strings, one numpy view each) and
dequantizing it takes seconds; the converted state dict loads in a fraction of that. Entries live
under $XDG_CACHE_HOME/interlock/weights/<key>/, key = source path + size + mtime.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import torch

from interlock.models.config import ModelConfig, RopeScaling
from interlock.models.tokenizer import cache_dir, file_key

_INV_FREQ = "rope_inv_freq"
_FORMAT = 2          # 2: ModelConfig grew the family fields (an older interlock cannot read those entries)


def _entry(source: Path) -> Path:
    return cache_dir("weights", f"v{_FORMAT}-{file_key(source)}")


def load_cached(source: Path) -> tuple[ModelConfig, dict[str, torch.Tensor], torch.Tensor | None] | None:
    """(fp32 config, fused state dict, inv_freq or None) if `source` was converted before, else None."""
    config = cached_config(source)
    if config is None:
        return None
    from safetensors.torch import load_file

    sd = load_file(str(_entry(source) / "model.safetensors"))
    return config, sd, sd.pop(_INV_FREQ, None)


def cached_config(source: Path) -> ModelConfig | None:
    """The fp32 config of `source` if it was converted before (milliseconds, against seconds of
    parsing the GGUF's metadata), else None."""
    entry = _entry(source)
    if not (entry / "model.safetensors").is_file():
        return None
    return config_from_json(entry / "config.json")


def config_from_json(path: Path) -> ModelConfig:
    """A ModelConfig saved as `dataclasses.asdict` JSON (this cache's and models/packed.py's)."""
    raw = json.loads(path.read_text())
    if raw.get("rope_scaling"):
        raw["rope_scaling"] = RopeScaling(**raw["rope_scaling"])
    return ModelConfig(**raw)


def save_cached(source: Path, config: ModelConfig, state: dict[str, torch.Tensor],
                inv_freq: torch.Tensor | None) -> None:
    """Write atomically (temp folder, then rename); a failure to write only costs speed next time."""
    from safetensors.torch import save_file

    entry = _entry(source)
    tmp = entry.with_name(f"{entry.name}.tmp{os.getpid()}")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.contiguous() for k, v in state.items()}
        if inv_freq is not None:
            tensors[_INV_FREQ] = inv_freq
        save_file(tensors, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(dataclasses.asdict(config)))
        os.replace(tmp, entry)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
