"""Our GGUF loader + forward against HF transformers' LlamaForCausalLM loaded by transformers' own
GGUF loader from the same file: an independent check of dequantization, Q/K un-permutation, RoPE,
attention and the paged cache. Loads the embedded SmolLM2-135M-Instruct (about 20 s)."""
from __future__ import annotations

import pytest
import torch

from interlock.models.batch import SeqChunk, build_batch
from interlock.testing.greedy import greedy_generate
from interlock.models.kv_cache import PagedKVCache
from interlock.models.loader import embedded_gguf_path, load_model

# One worker runs the whole module (`make test` is --dist loadgroup), so that its module fixtures
# (ours and transformers' model: ~25 s) are built once, not once on each worker.
pytestmark = pytest.mark.xdist_group("hf-parity")

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer in JSON."},
     {"role": "user", "content": "Give me a person named Ada, aged 36, from London."}],
    [{"role": "user", "content": "Write a haiku about speculative decoding."}],
]


@pytest.fixture(scope="module")
def ours():
    return load_model("smollm2-135m-instruct", weights="float", dtype="float32")


@pytest.fixture(scope="module")
def hf():
    from transformers import LlamaForCausalLM

    path = embedded_gguf_path()
    model = LlamaForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.eval()


@pytest.mark.parametrize("prompt", PROMPTS, ids=["capital", "json", "haiku"])
def test_logits_match_hf(prompt, ours, hf) -> None:
    ids = ours.tokenizer.encode_prompt(prompt)
    kv = PagedKVCache(ours.config, num_blocks=16)
    kv.add_sequence(0)
    kv.reserve(0, len(ids))
    logits = ours.model(build_batch([SeqChunk(0, tuple(ids), 0, tuple(range(len(ids))))], kv), kv)
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0]
    assert (logits - expected).abs().max().item() <= 1e-3


# By default one prompt for 32 tokens (the logits test covers all three); every prompt for 64 as a soak.
GREEDY = [pytest.param(PROMPTS[1], 32, id="json-32"),
          *(pytest.param(p, 64, id=f"{name}-64", marks=pytest.mark.soak)
            for p, name in zip(PROMPTS, ["capital", "json", "haiku"]))]


@pytest.mark.parametrize("prompt,n", GREEDY)
def test_greedy_tokens_match_hf(prompt, n: int, ours, hf) -> None:
    ids = ours.tokenizer.encode_prompt(prompt)
    got = greedy_generate(ours.model, ids, n)           # no stop ids: always n tokens
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    assert got == out[0, len(ids):].tolist()
