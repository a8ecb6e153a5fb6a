"""A saved HF tokenizer loaded in the time the `tokenizers` library takes to read its tokenizer.json,
not in AutoTokenizer's several seconds.

transformers 5 builds a model's own tokenizer class (GemmaTokenizer, ...) by reading tokenizer.json
in Python and building the vocabulary and merges again (3-5 s at Gemma 3's 262k ids); a plain
PreTrainedTokenizerFast hands the file to Rust (~1 s there). The two are the same tokenizer only where
the class adds nothing of its own; where it does (the class sets its own pre-tokenizer), AutoTokenizer's
Rust tokenizer is saved as `BACKEND_FILE` and read instead. Either is used only after it was found
equal to AutoTokenizer's once: `FAST_FILE` in a folder of ours records which file, the arguments that
rebuild the tokenizer, and the library versions that verdict holds for (others: checked again).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FAST_FILE = "interlock_fast.json"
BACKEND_FILE = "interlock_tokenizer.json"     # AutoTokenizer's Rust tokenizer, where tokenizer.json is not it
FORMAT = 1
# Texts encoded and decoded by both tokenizers before the quick one is trusted: spaces at the ends,
# runs of whitespace, accents, CJK, an emoji, a control character and byte-fallback material.
PROBES = ("Hello world!", "  two  spaces\n\n\tand tabs ", "naïve café 日本語 🤖", "a\x01b\x7f", "x" * 40,
          "def f(x):\n    return x  # done\n", "<<>> </s> <|im_end|> <end_of_turn>")
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}]


def load_saved(source: Path, quick: Path) -> Any:
    """The HF tokenizer saved in `source` (save_pretrained's files): the quick form that `quick` (a
    folder of ours; `source` itself where that is ours) holds where FAST_FILE there vouches for it,
    else AutoTokenizer's, with the verdict on a quick form recorded for the next load (and the quick
    form itself returned where it passed: every load gives the same class)."""
    fast = load_fast(source, quick)
    if fast is not None:
        return fast
    from transformers import AutoTokenizer

    slow = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    return record(slow, source, quick) or slow


def load_fast(source: Path, quick: Path) -> Any | None:
    """The quick form, or None where FAST_FILE is missing, damaged, for other library versions or
    names no file."""
    try:
        saved = json.loads((quick / FAST_FILE).read_text())
        if saved.get("format") != FORMAT or saved.get("versions") != versions() or saved.get("file") is None:
            return None
        return _build(_source_file(source, quick, saved["file"]), saved["kwargs"])
    except (OSError, ValueError, KeyError, TypeError):     # damaged or gone: decided again
        return None


def record(slow: Any, source: Path, quick: Path) -> Any | None:
    """Find the quick form of `slow` (AutoTokenizer's tokenizer of `source`) and write the verdict to
    `quick`: the file it reads (tokenizer.json, else BACKEND_FILE written from `slow`), or none where
    neither rebuilds the same tokenizer. Returns the quick form that passed, or None. Where `quick`
    cannot be written nothing is recorded."""
    kwargs = quick_kwargs(slow, source)
    try:
        quick.mkdir(parents=True, exist_ok=True)
        found, built = "tokenizer.json", _rebuilt(slow, source / "tokenizer.json", kwargs)
        if built is None:
            _write(quick / BACKEND_FILE, slow.backend_tokenizer.to_str())
            found, built = BACKEND_FILE, _rebuilt(slow, quick / BACKEND_FILE, kwargs)
        _write(quick / FAST_FILE, json.dumps({"format": FORMAT, "versions": versions(),
                                              "file": found if built is not None else None,
                                              "kwargs": kwargs if built is not None else None}))
    except OSError:
        return None
    return built


def _source_file(source: Path, quick: Path, name: str) -> Path:
    return source / name if name == "tokenizer.json" else quick / name


def _rebuilt(slow: Any, file: Path, kwargs: dict[str, Any]) -> Any | None:
    """The quick form read from `file`, where it is the same tokenizer as `slow`; else None."""
    if not file.exists():
        return None
    try:
        built = _build(file, kwargs)
    except Exception:  # noqa: BLE001 - a file the quick path cannot read is simply not the quick form
        return None
    return built if same_tokenizer(slow, built) else None


def _write(target: Path, text: str) -> None:
    """Write to a temporary name, then rename: a concurrent loader reads a whole file or none."""
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def versions() -> dict[str, str]:
    import tokenizers
    import transformers

    return {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__}


def quick_kwargs(hf: Any, source: Path) -> dict[str, Any]:
    """What PreTrainedTokenizerFast needs beside tokenizer.json to be `hf`: its special tokens (by
    text; their flags live in tokenizer.json), chat template and the settings encode and decode read."""
    specials = {name: value if isinstance(value, str) else [str(v) for v in value]
                for name, value in hf.special_tokens_map.items()}
    return {**specials, "chat_template": hf.chat_template, "model_max_length": hf.model_max_length,
            "padding_side": hf.padding_side, "truncation_side": hf.truncation_side,
            "clean_up_tokenization_spaces": hf.clean_up_tokenization_spaces,
            "split_special_tokens": getattr(hf, "split_special_tokens", False), "name_or_path": str(source)}


def _build(file: Path, kwargs: dict[str, Any]) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(file), **kwargs)


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether two HF tokenizers are the same for everything interlock and the grammar backends read:
    the Rust tokenizer whole (vocabulary, merges, added tokens, pre- and post-processing), the special
    tokens and settings, and encode, decode and the chat template on the probe texts."""
    if a.backend_tokenizer.to_str() != b.backend_tokenizer.to_str():
        return False
    settings = ("special_tokens_map", "all_special_ids", "chat_template", "model_max_length", "padding_side",
                "truncation_side", "clean_up_tokenization_spaces", "bos_token_id", "eos_token_id",
                "pad_token_id", "unk_token_id")
    if any(getattr(a, s, None) != getattr(b, s, None) for s in settings) or len(a) != len(b):
        return False
    if {i: str(t) for i, t in a.added_tokens_decoder.items()} != {i: str(t) for i, t in b.added_tokens_decoder.items()}:
        return False
    text = "".join(PROBES) + "".join(str(t) for t in a.added_tokens_decoder.values())[:2000]
    for probe in (*PROBES, text):
        for special in (False, True):
            ids = _outcome(a.encode, probe, add_special_tokens=special)
            if ids != _outcome(b.encode, probe, add_special_tokens=special):
                return False
            if isinstance(ids, list) and any(_outcome(a.decode, ids, skip_special_tokens=s)
                                             != _outcome(b.decode, ids, skip_special_tokens=s) for s in (False, True)):
                return False
    return _outcome(_rendered, a) == _outcome(_rendered, b)


def _outcome(f: Any, *args: Any, **kwargs: Any) -> Any:
    """f's result, or what it raised (a vocabulary that cannot spell a probe must refuse it alike)."""
    try:
        return f(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - compared, not handled
        return f"{type(exc).__name__}: {exc}"


def _rendered(hf: Any) -> str | None:
    return hf.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True) if hf.chat_template else None
