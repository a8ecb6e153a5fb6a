"""The quick form of a saved tokenizer (models/fast_tokenizer.py): it is AutoTokenizer's tokenizer for
everything interlock reads, it is used only once it was found so, a damaged or stale verdict is
decided again, and a tokenizer class that builds its own pipeline is kept as its own Rust tokenizer."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from interlock.models import fast_tokenizer as fast
from interlock.models.loader import load_tokenizer
from interlock.models.tokenizer import load_gguf_tokenizer, load_hf_tokenizer
from interlock.testing.families import hf_model, save_dir, write_gguf


@pytest.fixture
def saved(tmp_path) -> Path:
    """A folder of ours holding the tiny preset's tokenizer (save_pretrained's files), no verdict yet."""
    folder = tmp_path / "tok"
    load_tokenizer("tiny").hf.save_pretrained(str(folder))
    return folder


def verdict(folder: Path) -> dict:
    return json.loads((folder / fast.FAST_FILE).read_text())


def test_the_first_load_checks_and_the_next_is_quick(saved):
    slow = fast.load_saved(saved, saved)
    assert verdict(saved)["file"] == "tokenizer.json"
    quick = fast.load_fast(saved, saved)
    assert quick is not None and fast.same_tokenizer(slow, quick)
    assert fast.same_tokenizer(AutoTokenizer.from_pretrained(str(saved)), fast.load_saved(saved, saved))


@pytest.mark.parametrize("damage", ["garbage", "empty", "no-kwargs", "other-versions"])
def test_a_damaged_or_stale_verdict_is_decided_again(saved, damage):
    fast.load_saved(saved, saved)
    good = verdict(saved)
    text = {"garbage": "{not json", "empty": "",
            "no-kwargs": json.dumps({**good, "kwargs": None}),
            "other-versions": json.dumps({**good, "versions": {"transformers": "0"}})}[damage]
    (saved / fast.FAST_FILE).write_text(text)
    assert fast.load_fast(saved, saved) is None
    assert fast.load_saved(saved, saved) is not None
    assert verdict(saved) == good                     # written again, whole


def test_a_tokenizer_unlike_its_quick_form_is_never_loaded_quick(saved):
    """A verdict is only written for a tokenizer the quick form matches: here the slow one has a
    chat template the quick arguments leave out, so no file rebuilds it."""
    slow = AutoTokenizer.from_pretrained(str(saved))
    quick = fast._build(saved / "tokenizer.json", {**fast.quick_kwargs(slow, saved), "chat_template": "x"})
    assert not fast.same_tokenizer(slow, quick)


def test_a_class_that_builds_its_own_pipeline_is_kept_as_its_own_rust_tokenizer(tmp_path):
    """transformers' GemmaTokenizer sets its own pre-tokenizer over this byte-level vocabulary, so
    tokenizer.json is not what AutoTokenizer gives; its Rust tokenizer is kept and read instead."""
    tok = load_gguf_tokenizer(write_gguf(hf_model("gemma3-gguf"), tmp_path / "g.gguf"))
    assert tok.tables is not None and verdict(tok.tables)["file"] == fast.BACKEND_FILE
    slow = AutoTokenizer.from_pretrained(str(tok.tables))
    assert fast.same_tokenizer(slow, fast.load_fast(tok.tables, tok.tables))
    again = load_gguf_tokenizer(tmp_path / "g.gguf")
    assert fast.same_tokenizer(slow, again.hf) and again.eos_token_ids == tok.eos_token_ids


def test_an_hf_checkpoint_keeps_its_quick_form_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = save_dir(hf_model("qwen3"), tmp_path / "ckpt")
    first = load_hf_tokenizer(folder)
    assert first.tables is not None and first.tables.is_relative_to(tmp_path / "cache")
    assert not (folder / fast.FAST_FILE).exists()             # the checkpoint is left as it was
    again = load_hf_tokenizer(folder)
    assert again.tables == first.tables and fast.same_tokenizer(first.hf, again.hf)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 77}))
    changed = load_hf_tokenizer(folder)                        # another file: another quick form
    assert changed.tables != first.tables and changed.hf.model_max_length == 77


@pytest.mark.parametrize("family", ["qwen3", "gemma3-gguf", "phi3", "embedded"])
def test_naming_the_model_type_converts_a_gguf_as_autotokenizer_alone_does(family, tmp_path):
    """A GGUF's tokenizer is converted with its model_type named (HF_MODEL_TYPES; the embedded model is
    a Llama), which spares AutoTokenizer reading the whole file to learn it: same class, same tokenizer."""
    from interlock.models.gguf_file import GGUFFile
    from interlock.models.loader import embedded_gguf_path
    from interlock.models.tokenizer import _converted, gguf_arch

    path = embedded_gguf_path() if family == "embedded" else write_gguf(hf_model(family), tmp_path / "m.gguf")
    fields = GGUFFile(path).fields
    assert gguf_arch(path, fields) is not None
    named = _converted(path, fields)
    alone = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert type(named) is type(alone) and fast.same_tokenizer(named, alone)
