"""Tokenizer and chat template, from GGUF metadata or an HF directory, cached on disk after conversion.

Converting a GGUF vocabulary into an HF fast tokenizer takes seconds; the result is saved under
$XDG_CACHE_HOME/interlock/tokenizers/<key>/ (key: file path, size and mtime), so later loads
take a fraction of a second.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interlock.protocol.errors import ModelLoadError
from interlock.protocol.grammar import GrammarSpec, Reasoning
from interlock.protocol.types import TokenId

Message = dict[str, str]
THINK_MARKERS = ("<think>", "</think>")      # Qwen3's (and the R1 distills') thinking markers


def cache_dir(*parts: str) -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root, "interlock", *parts)


def file_key(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Tokenizer:
    """An HF fast tokenizer plus what generation needs to know about it.

    `hf` is handed as is to the grammar backends (xgrammar and llguidance both read HF tokenizers).
    """

    hf: Any                              # transformers PreTrainedTokenizerBase (fast)
    key: str                             # identifies the vocabulary, for grammar cache keys
    eos_token_ids: tuple[TokenId, ...]

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[TokenId]:
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[TokenId], skip_special_tokens: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def reasoning_markers(self) -> tuple[str, str] | None:
        """The thinking markers where this vocabulary has each as a single token (Qwen3's <think> and
        </think>): what a Reasoning grammar should use for this model. None: the model has none."""
        return THINK_MARKERS if all(len(self.encode(m)) == 1 for m in THINK_MARKERS) else None

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                    enable_thinking: bool | None = None) -> str:
        """The chat template's text. enable_thinking reaches templates that have that switch (Qwen3's);
        None leaves the template's default."""
        template = getattr(self.hf, "chat_template", None)
        if not template:
            raise ModelLoadError("this tokenizer has no chat template; pass a plain string prompt instead")
        switch = enable_thinking is not None and "enable_thinking" in template
        extra = {"enable_thinking": enable_thinking} if switch else {}
        return self.hf.apply_chat_template(list(messages), tokenize=False,
                                           add_generation_prompt=add_generation_prompt, **extra)

    def encode_prompt(self, prompt: str | Sequence[Message], grammar: GrammarSpec | None = None) -> list[TokenId]:
        """A plain string is encoded as is; a list of chat messages goes through the chat template.

        grammar: the request's. A template with a thinking switch thinks for a Reasoning grammar and
        answers at once for any other grammar (which constrains the answer from its first token);
        with no grammar the template decides."""
        if isinstance(prompt, str):
            return self.encode(prompt)
        thinking = None if grammar is None else isinstance(grammar, Reasoning)
        return self.encode(self.render_chat(prompt, enable_thinking=thinking))


def _wrap(hf: Any, key: str) -> Tokenizer:
    eos = [hf.eos_token_id] if hf.eos_token_id is not None else []
    return Tokenizer(hf=hf, key=key, eos_token_ids=tuple(eos))


def _save(hf: Any, target: Path, generation: dict[str, Any] | None = None) -> None:
    """Write to a temporary folder, then rename: a concurrent loader never sees half a tokenizer."""
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    hf.save_pretrained(str(tmp))
    if generation is not None:
        (tmp / "generation_config.json").write_text(json.dumps(generation))
    try:
        os.replace(tmp, target)
    except OSError:                      # another process got there first; theirs is as good
        shutil.rmtree(tmp, ignore_errors=True)


def _load_dir(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def load_gguf_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer stored in a GGUF file's metadata, converted once and cached (as an HF tokenizer
    directory, with generation_config.json listing the file's end-of-turn id, `tokenizer.ggml.eot_token_id`:
    Gemma 3's <end_of_turn>, which load_hf_tokenizer then stops at too)."""
    key = "gguf-" + file_key(path)
    cached = cache_dir("tokenizers", key)
    if not (cached / "tokenizer.json").exists():
        import gguf
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
        field = gguf.GGUFReader(str(path)).fields.get("tokenizer.ggml.eot_token_id")
        stops = [] if field is None else [int(field.contents())]
        _save(hf, cached, {"eos_token_id": stops})
    tok = load_hf_tokenizer(cached)
    return Tokenizer(hf=tok.hf, key=key, eos_token_ids=tok.eos_token_ids)


def load_hf_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer of an HF checkpoint directory. Its stop ids are the tokenizer's eos and every id
    generation_config.json lists: chat models end a turn with a token of their own (Gemma 3's
    <end_of_turn>, Phi-3's <|end|>) that the tokenizer's eos is not."""
    keyed = path / "tokenizer.json" if (path / "tokenizer.json").exists() else path
    tok = _wrap(_load_dir(path), "hf-" + file_key(keyed))
    try:
        listed = json.loads((path / "generation_config.json").read_text()).get("eos_token_id")
    except (OSError, json.JSONDecodeError):
        return tok
    listed = [listed] if isinstance(listed, int) else list(listed or [])
    extra = tuple(int(i) for i in listed if int(i) not in tok.eos_token_ids and 0 <= int(i) < tok.vocab_size)
    return Tokenizer(hf=tok.hf, key=tok.key, eos_token_ids=tok.eos_token_ids + extra)


def truncated_tokenizer(base: Tokenizer, n_vocab: int) -> Tokenizer:
    """A real byte-level BPE tokenizer cut down to its first `n_vocab` ids (for fast tests).

    Keeps every token with id < n_vocab and the merges whose parts and result all survive, so the
    result still tokenizes any text (bytes are low ids), specials and chat template included.
    """
    key = f"{base.key}-first{n_vocab}"
    cached = cache_dir("tokenizers", key)
    if not (cached / "tokenizer.json").exists():
        spec = json.loads(base.hf.backend_tokenizer.to_str())
        model = spec["model"]
        if model.get("type") != "BPE":
            raise ValueError(f"can only truncate BPE tokenizers, got {model.get('type')}")
        vocab = {tok: i for tok, i in model["vocab"].items() if i < n_vocab}
        merges = [m if isinstance(m, list) else m.split(" ", 1) for m in model["merges"]]
        model["vocab"] = vocab
        model["merges"] = [m for m in merges if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
        spec["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] < n_vocab]
        from transformers import PreTrainedTokenizerFast
        from tokenizers import Tokenizer as RawTokenizer

        hf = PreTrainedTokenizerFast(tokenizer_object=RawTokenizer.from_str(json.dumps(spec)),
                                     eos_token=base.hf.eos_token, bos_token=base.hf.bos_token,
                                     unk_token=base.hf.unk_token, pad_token=base.hf.pad_token)
        hf.chat_template = base.hf.chat_template
        _save(hf, cached)
    return _wrap(_load_dir(cached), key)
