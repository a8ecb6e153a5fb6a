"""The special ids a prompt gets, as the model's tokenizer asks (models/tokenizer.py): the BOS before a
plain prompt exactly where the tokenizer adds one, once, never doubled by a chat template that wrote
it, never added to token ids. Pinned over the embedded SmolLM2 (adds none), the tiny preset, a GGUF
whose metadata asks for a BOS, and an HF directory whose post-processor adds one; the real Gemma
file is pinned in test_real_gemma.py."""
from __future__ import annotations

import pytest
from tokenizers import processors

from interlock.engine.intake import Intake
from interlock.models.loader import load_tokenizer
from interlock.models.tokenizer import load_gguf_tokenizer, load_hf_tokenizer
from interlock.protocol.errors import InvalidParameterError
from interlock.testing.families import hf_model, save_dir, write_gguf

TEXT = "The capital of France is"
CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "tiny"])
def test_tokenizers_that_add_nothing_add_nothing(name) -> None:
    tok = load_tokenizer(name)
    assert tok.prefix == () and tok.suffix == ()
    assert tok.encode_prompt(TEXT) == tok.encode(TEXT)
    assert tok.encode_prompt(CHAT) == tok.encode(tok.render_chat(CHAT))


@pytest.fixture(scope="module")
def gemma_gguf(tmp_path_factory):
    model = hf_model("gemma3-gguf")
    folder = tmp_path_factory.mktemp("gguf")
    return {flag: load_gguf_tokenizer(write_gguf(model, folder / f"bos-{flag}.gguf", add_bos=flag))
            for flag in (True, False)}


def test_a_gguf_that_asks_for_a_bos_gets_one(gemma_gguf) -> None:
    tok, word = gemma_gguf[True], "Paris"       # the written vocabulary spells printable ASCII only
    assert tok.prefix == (1,) and tok.suffix == ()
    ids = tok.encode_prompt(word)
    assert ids == [1, *tok.encode(word)] and len(ids) > 1
    assert tok.encode_prompt(tok.decode([1]) + word) == ids          # already there: not doubled
    assert gemma_gguf[False].prefix == ()                            # add_bos_token = false: none
    assert gemma_gguf[False].encode_prompt(word) == tok.encode(word)


@pytest.fixture(scope="module")
def bos_dir(tmp_path_factory):
    """An HF checkpoint directory whose tokenizer's post-processor puts its BOS before every text."""
    path = save_dir(hf_model("qwen3"), tmp_path_factory.mktemp("hf") / "bos")
    hf = load_tokenizer("tiny").hf
    hf.bos_token = "<|endoftext|>"           # SmolLM2's own BOS is <|im_start|>, which its template writes
    bos = hf.convert_tokens_to_ids(hf.bos_token)
    hf.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{hf.bos_token} $A", special_tokens=[(hf.bos_token, bos)])
    hf.save_pretrained(str(path))
    return path, bos


def test_an_hf_tokenizer_that_adds_a_bos_gets_one_once(bos_dir) -> None:
    path, bos = bos_dir
    tok = load_hf_tokenizer(path)
    assert tok.prefix == (bos,)
    assert tok.encode_prompt(TEXT) == [bos, *tok.encode(TEXT)]
    # SmolLM2's template writes no BOS: the chat prompt gets one in front...
    assert tok.encode_prompt(CHAT) == [bos, *tok.encode(tok.render_chat(CHAT))]
    # ...and a template that writes it keeps exactly one
    tok.hf.chat_template = "{{ bos_token }}" + tok.hf.chat_template
    rendered = tok.encode(tok.render_chat(CHAT))
    assert rendered[0] == bos and tok.encode_prompt(CHAT) == rendered


def test_token_ids_go_as_given_and_guidance_falls_back_to_the_bos(bos_dir) -> None:
    tok = load_hf_tokenizer(bos_dir[0])
    intake = Intake(tok, max_context=64)
    assert intake.encode([5, 6, 7]) == [5, 6, 7]
    assert intake.encode(TEXT) == [bos_dir[1], *tok.encode(TEXT)]
    assert intake.unconditional() == tok.encode_prompt([{"role": "user", "content": ""}])
    tok.hf.chat_template = None                                      # a base model: its BOS alone
    assert intake.unconditional() == [bos_dir[1]]
    bare = Intake(load_tokenizer("tiny"), max_context=64)
    bare.tokenizer.hf.chat_template = None
    with pytest.raises(InvalidParameterError, match="negative prompt"):
        bare.unconditional()
