"""Hugging Face hub ids ("Qwen/Qwen2.5-0.5B-Instruct") as checkpoint folders, through huggingface_hub.

`snapshot_download` fetches only what load_model reads (the config, the safetensors shards, the
tokenizer's files) into the hub cache (HF_HOME, HF_HUB_CACHE) and returns the snapshot folder,
which then loads like any HF checkpoint directory. A file already in the cache is not fetched
again; with HF_HUB_OFFLINE=1 (or no network) the cache is all it reads.
"""
from __future__ import annotations

import re
from pathlib import Path

from interlock.protocol.errors import ModelLoadError, ModelNotFoundError, UnsupportedModelError

# what an HF checkpoint folder needs here: models/hf_loader.py and models/tokenizer.py read these
ALLOW_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
                  "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                  "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json"]
# owner/name, as the hub spells repository ids (letters, digits, '-', '_', '.')
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def is_hub_id(text: str) -> bool:
    """Whether `text` has the form of a hub model id (not whether the hub has it)."""
    return bool(_HUB_ID.fullmatch(text)) and ".." not in text


def hub_snapshot(repo_id: str) -> Path:
    """The local folder of hub model `repo_id` (downloaded on first use, from the cache after).

    Raises ModelNotFoundError (not on the hub, or offline and not in the cache), UnsupportedModelError
    (the repository has no config.json: not a transformers checkpoint), ModelLoadError (the download failed).
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=ALLOW_PATTERNS))
    except LocalEntryNotFoundError as exc:         # offline, or the hub unreachable, and not cached
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the hub could not be reached"
        raise ModelNotFoundError(
            f"{repo_id!r} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}: download it "
            f"once with network access (e.g. `hf download {repo_id}`), or pass a local path") from exc
    except GatedRepoError as exc:
        raise ModelNotFoundError(f"{repo_id!r} is gated on the Hugging Face hub: accept its terms on the "
                                 f"model page and log in (`hf auth login`)") from exc
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        raise ModelNotFoundError(f"no model {repo_id!r} on the Hugging Face hub and no file or folder of that "
                                 f"name here (a private model needs `hf auth login`)") from exc
    except (HfHubHTTPError, OSError) as exc:
        raise ModelLoadError(f"downloading {repo_id!r} from the Hugging Face hub failed: {exc}") from exc
    if not (folder / "config.json").is_file():
        raise UnsupportedModelError(f"hub model {repo_id!r} has no config.json (not a transformers checkpoint); "
                                    f"for a GGUF repository, download its .gguf file and pass its path")
    return folder
