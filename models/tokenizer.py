"""Tokenizer and chat template, from GGUF metadata or an HF directory, cached on disk after conversion.

Converting a GGUF vocabulary into an HF fast tokenizer takes seconds; the result is saved under
$XDG_CACHE_HOME/interlock/tokenizers/<key>/ (key: file path, size and mtime), so later loads
take a fraction of a second.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
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
    # The special ids the model's tokenizer puts around a text it encodes (Gemma's, Llama 3's and
    # Mistral's BOS before; an EOS after for the few that ask): what llama.cpp and transformers
    # add to a plain prompt. Empty for SmolLM2, Qwen and Phi, whose tokenizers add none.
    prefix: tuple[TokenId, ...] = ()
    suffix: tuple[TokenId, ...] = ()
    # A folder of ours where tables built from this vocabulary may be kept (grammars/tables.py);
    # None (a tokenizer made in memory): built each time. Code that changes `hf`'s vocabulary in
    # memory must drop it (replace(tok, tables=None)): the kept tables are of the saved one.
    tables: Path | None = None

    @functools.cached_property
    def vocab_size(self) -> int:
        """The tokenizer's ids, added tokens included (len() of an HF tokenizer builds its whole
        vocabulary, ~0.3 ms at Gemma 3's 262k: read once)."""
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

    @property
    def has_chat_template(self) -> bool:
        """Whether chat messages can be sent: base models (Gemma 3 270M, Llama 3.2 1B) have no template."""
        return bool(getattr(self.hf, "chat_template", None))

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                    enable_thinking: bool | None = None) -> str:
        """The chat template's text. enable_thinking reaches templates that have that switch (Qwen3's);
        None leaves the template's default."""
        if not self.has_chat_template:
            raise ModelLoadError("this model has no chat template (a base model): send a plain string prompt "
                                 "instead (Engine.complete(\"text\"), `interlock generate --raw`, or the "
                                 "server's /v1/completions)")
        template = self.hf.chat_template
        switch = enable_thinking is not None and "enable_thinking" in template
        extra = {"enable_thinking": enable_thinking} if switch else {}
        return self.hf.apply_chat_template(list(messages), tokenize=False,
                                           add_generation_prompt=add_generation_prompt, **extra)

    def encode_prompt(self, prompt: str | Sequence[Message], grammar: GrammarSpec | None = None) -> list[TokenId]:
        """A prompt's ids as the model expects them: a plain string with the tokenizer's special ids
        around it (`prefix`, `suffix`), a list of chat messages through the chat template, with the
        BOS put in front only where the template did not write it (an EOS after the generation
        prompt would end the turn, so chat gets no suffix). Never doubled: a string that already
        starts with the BOS (typed as "<bos>") keeps one.

        grammar: the request's. A template with a thinking switch thinks for a Reasoning grammar and
        answers at once for any other grammar (which constrains the answer from its first token);
        with no grammar the template decides."""
        if isinstance(prompt, str):
            return self._framed(self.encode(prompt), self.suffix)
        thinking = None if grammar is None else isinstance(grammar, Reasoning)
        return self._framed(self.encode(self.render_chat(prompt, enable_thinking=thinking)), ())

    def _framed(self, ids: list[TokenId], suffix: tuple[TokenId, ...]) -> list[TokenId]:
        head = [] if tuple(ids[:len(self.prefix)]) == self.prefix else list(self.prefix)
        tail = [] if not suffix or tuple(ids[len(ids) - len(suffix):]) == suffix else list(suffix)
        return head + ids + tail


def _wrap(hf: Any, key: str, specials: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> Tokenizer:
    eos = [hf.eos_token_id] if hf.eos_token_id is not None else []
    prefix, suffix = specials if specials is not None else added_specials(hf)
    return Tokenizer(hf=hf, key=key, eos_token_ids=tuple(eos), prefix=prefix, suffix=suffix)


def added_specials(hf: Any) -> tuple[tuple[TokenId, ...], tuple[TokenId, ...]]:
    """The ids an HF tokenizer adds before and after a text when asked for its special tokens (its
    post-processor, or a slow tokenizer's add_bos_token / add_eos_token): read off one encoding
    with and without them, which covers every way a tokenizer can be told to add them."""
    bare = hf.encode("a", add_special_tokens=False)
    full = hf.encode("a", add_special_tokens=True)
    for i in range(len(full) - len(bare) + 1):
        if full[i:i + len(bare)] == bare:
            return tuple(full[:i]), tuple(full[i + len(bare):])
    return (), ()                        # a tokenizer that rewrites the text itself: add nothing


def gguf_specials(fields: Any) -> tuple[tuple[TokenId, ...], tuple[TokenId, ...]] | None:
    """The special ids a GGUF file's metadata asks to be added around a text, as llama.cpp adds them
    (`tokenizer.ggml.add_bos_token` / `add_eos_token` with the BOS / EOS id). None: the file does
    not say, and the converted tokenizer's own rule stands."""
    def flag(name: str) -> bool | None:
        field = fields.get(f"tokenizer.ggml.{name}")
        return None if field is None else bool(field.contents())

    def token(name: str) -> tuple[TokenId, ...]:
        field = fields.get(f"tokenizer.ggml.{name}_token_id")
        return () if field is None else (int(field.contents()),)

    bos, eos = flag("add_bos_token"), flag("add_eos_token")
    if bos is None and eos is None:
        return None
    return (token("bos") if bos else ()), (token("eos") if eos else ())


SPECIALS_FILE = "interlock_specials.json"      # a converted GGUF's prefix and suffix ids, from its metadata


def _save(hf: Any, target: Path, generation: dict[str, Any] | None = None,
          specials: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> None:
    """Write to a temporary folder, then rename: a concurrent loader never sees half a tokenizer."""
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    hf.save_pretrained(str(tmp))
    if generation is not None:
        (tmp / "generation_config.json").write_text(json.dumps(generation))
    if specials is not None:
        (tmp / SPECIALS_FILE).write_text(json.dumps({"prefix": specials[0], "suffix": specials[1]}))
    try:
        os.replace(tmp, target)
    except OSError:                      # another process got there first; theirs is as good
        shutil.rmtree(tmp, ignore_errors=True)


def _load_dir(path: Path, quick: Path) -> Any:
    """The HF tokenizer saved in `path`, by way of the quick form kept in `quick` (a folder of ours:
    models/fast_tokenizer.py)."""
    from interlock.models.fast_tokenizer import load_saved

    return load_saved(path, quick)


def folder_key(path: Path) -> str:
    """Identifies what an HF checkpoint folder's tokenizer is read from: every file in it but the
    weights (tokenizer.json, its config, a chat template file, generation_config.json)."""
    weights = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".h5", ".msgpack")
    files = sorted(f for f in path.iterdir() if f.is_file() and not f.name.endswith(weights))
    return hashlib.sha256("|".join(file_key(f) for f in files).encode()).hexdigest()[:20]


def load_gguf_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer stored in a GGUF file's metadata, converted once and cached (as an HF tokenizer
    directory, with generation_config.json listing the file's end-of-turn id, `tokenizer.ggml.eot_token_id`:
    Gemma 3's <end_of_turn>, which load_hf_tokenizer then stops at too)."""
    key = "gguf2-" + file_key(path)      # gguf2: the cache holds the metadata's special-token rule
    cached = cache_dir("tokenizers", key)
    if not (cached / "tokenizer.json").exists():
        from interlock.models.gguf_file import GGUFFile

        fields = GGUFFile(path).fields           # gguf.GGUFReader: ~20 s more at 262k tokens
        hf = _converted(path, fields)
        field = fields.get("tokenizer.ggml.eot_token_id")
        stops = [] if field is None else [int(field.contents())]
        _save(hf, cached, {"eos_token_id": stops}, gguf_specials(fields) or added_specials(hf))
    return replace(load_hf_tokenizer(cached, quick=cached), key=key)


# transformers' model_type for the GGUF architectures whose conversion tests/models/test_fast_tokenizer.py
# pins. Named, it spares AutoTokenizer reading the whole file with gguf.GGUFReader only to learn it
# (23 s of a 30 s conversion at Gemma 3's 262k tokens). Llama has no tokenizer class of its own:
# AutoTokenizer falls back to TokenizersBackend (PreTrainedTokenizerFast) for it.
HF_MODEL_TYPES = {"llama": None, "qwen3": "qwen3", "gemma3": "gemma3_text", "phi3": "phi3"}


def _converted(path: Path, fields: Any) -> Any:
    """transformers' conversion of a GGUF file's tokenizer, as AutoTokenizer makes it."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    where: dict[str, Any] = {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name,
                             "local_files_only": True}
    arch = gguf_arch(path, fields)
    if arch is None:
        return AutoTokenizer.from_pretrained(**where)
    if HF_MODEL_TYPES[arch] is None:
        return PreTrainedTokenizerFast.from_pretrained(**where)
    return AutoTokenizer.from_pretrained(**where, tokenizer_type=HF_MODEL_TYPES[arch])


def gguf_arch(path: Path, fields: Any) -> str | None:
    """The file's architecture where HF_MODEL_TYPES knows how AutoTokenizer converts it, else None: an
    architecture it does not list, a Llama file named for Mistral (which transformers may read as
    one), or a file beside an HF config (which AutoTokenizer would also read to choose the class)."""
    def text(key: str) -> str:
        field = fields.get(key)
        return "" if field is None else str(field.contents())

    arch = text("general.architecture")
    if arch not in HF_MODEL_TYPES or (arch == "llama" and "mistral" in text("general.name").lower()):
        return None
    if any((path.parent / name).exists() for name in ("config.json", "tokenizer_config.json")):
        return None
    return arch


def load_hf_tokenizer(path: Path, quick: Path | None = None) -> Tokenizer:
    """The tokenizer of an HF checkpoint directory. Its stop ids are the tokenizer's eos and every id
    generation_config.json lists: chat models end a turn with a token of their own (Gemma 3's
    <end_of_turn>, Phi-3's <|end|>) that the tokenizer's eos is not.

    quick: the folder of ours that keeps its quick form and grammar tables (None: one in the cache,
    keyed by the folder's files; a folder we wrote passes itself)."""
    keyed = path / "tokenizer.json" if (path / "tokenizer.json").exists() else path
    quick = quick or cache_dir("tokenizers", "hfq-" + folder_key(path))
    tok = replace(_wrap(_load_dir(path, quick), "hf-" + file_key(keyed), _saved_specials(path)), tables=quick)
    try:
        listed = json.loads((path / "generation_config.json").read_text()).get("eos_token_id")
    except (OSError, json.JSONDecodeError):
        return tok
    listed = [listed] if isinstance(listed, int) else list(listed or [])
    extra = tuple(int(i) for i in listed if int(i) not in tok.eos_token_ids and 0 <= int(i) < tok.vocab_size)
    return replace(tok, eos_token_ids=tok.eos_token_ids + extra)


def _saved_specials(path: Path) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    try:
        saved = json.loads((path / SPECIALS_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return tuple(saved["prefix"]), tuple(saved["suffix"])


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
    return replace(_wrap(_load_dir(cached, cached), key), tables=cached)
