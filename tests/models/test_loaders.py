"""Loaders against transformers' own loaders on small synthetic checkpoints, and bad input."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from interlock.models.batch import SeqChunk, build_batch
from interlock.testing.greedy import check_prompt_fits
from interlock.models.kv_cache import PagedKVCache
from interlock.models.loader import load_model
from interlock.protocol.errors import ModelNotFoundError, PromptTooLongError, UnsupportedModelError

HIDDEN, HEADS, KV_HEADS, INTER, VOCAB, LAYERS = 256, 4, 2, 512, 512, 2


def hf_config(arch: str = "LlamaForCausalLM", **extra) -> dict:
    cfg = {"architectures": [arch], "model_type": "qwen2" if "Qwen" in arch else "llama",
           "hidden_size": HIDDEN, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
           "intermediate_size": INTER, "vocab_size": VOCAB, "num_hidden_layers": LAYERS,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
           "tie_word_embeddings": False, "torch_dtype": "float32"}
    cfg.update(extra)
    return cfg


def random_hf_model(cfg: dict):
    import transformers

    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    cls = getattr(transformers, cfg["architectures"][0])
    model = cls(config).eval()
    with torch.no_grad():                      # default init is tiny; widen it so logits differ
        for p in model.parameters():
            p.normal_(0, 0.05 if p.dim() > 1 else 0.5)
    return model


def our_logits(path: str, tokens: list[int]) -> torch.Tensor:
    lm = load_model(path, weights="float")
    kv = PagedKVCache(lm.config, num_blocks=8)
    kv.add_sequence(0)
    kv.reserve(0, len(tokens))
    return lm.model(build_batch([SeqChunk(0, tuple(tokens), 0, tuple(range(len(tokens))))], kv), kv)


def save_hf_dir(model, tmp_path: Path, cfg: dict) -> Path:
    from safetensors.torch import save_file
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers

    raw = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="t1").save_pretrained(str(tmp_path))
    state = {k: v.contiguous() for k, v in model.state_dict().items()
             if not (cfg.get("tie_word_embeddings") and k == "lm_head.weight")}
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize("case", ["llama", "llama3-rope", "qwen2-bias"])
def test_hf_directory_matches_transformers(case: str, tmp_path: Path) -> None:
    if case == "llama":
        cfg = hf_config()
    elif case == "llama3-rope":
        cfg = hf_config(max_position_embeddings=2048, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64})
    else:
        cfg = hf_config("Qwen2ForCausalLM", tie_word_embeddings=True)
    model = random_hf_model(cfg)
    if case == "qwen2-bias":
        assert model.model.layers[0].self_attn.q_proj.bias is not None
    path = save_hf_dir(model, tmp_path, cfg)
    tokens = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38] * 10     # 100 positions: past the llama3 original window
    with torch.no_grad():
        expected = model(torch.tensor([tokens])).logits[0]
    assert (our_logits(str(path), tokens) - expected).abs().max().item() <= 1e-3


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to q/k rows (the inverse of our unpermute)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_kquant_bytes(rows: int, cols: int, qtype, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks with small finite fp16 scales (gguf-py cannot quantize K types)."""
    from gguf.constants import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
    if qtype.name == "Q4_K":                 # d, dmin are the first two fp16 of a block
        data[..., 0:2] = scale
        data[..., 2:4] = scale
    else:                                    # Q6_K: d is the last fp16 of a block
        data[..., -2:] = scale
    return data.reshape(rows, -1)


def test_gguf_with_mixed_quant_types_matches_transformers_gguf_loader(tmp_path: Path) -> None:
    import gguf
    from gguf import quants
    from gguf.constants import GGMLQuantizationType as Q
    from transformers import LlamaForCausalLM

    cfg = hf_config()
    hf = random_hf_model(cfg)
    sd = {k: v.numpy() for k, v in hf.state_dict().items()}
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    writer.add_tokenizer_model("gpt2")
    vocab = [bytes([i]).decode("latin-1") for i in range(256)] + [f"<x{i}>" for i in range(VOCAB - 256)]
    writer.add_token_list(vocab)
    writer.add_token_types([1] * VOCAB)
    writer.add_token_scores([0.0] * VOCAB)
    writer.add_eos_token_id(1)
    plain = {"model.embed_tokens.weight": ("token_embd.weight", Q.Q8_0),
             "model.norm.weight": ("output_norm.weight", Q.F32), "lm_head.weight": ("output.weight", Q.F16)}
    layer_types = {"q_proj": ("attn_q", Q.Q4_0), "k_proj": ("attn_k", Q.Q4_1), "v_proj": ("attn_v", Q.BF16),
                   "o_proj": ("attn_output", Q.Q8_0), "gate_proj": ("ffn_gate", Q.Q4_K),
                   "up_proj": ("ffn_up", Q.Q6_K), "down_proj": ("ffn_down", Q.Q4_1)}
    for name, w in sd.items():
        if name in plain:
            gname, qtype = plain[name]
        else:
            parts = name.split(".")              # model.layers.{i}.{module}[.{proj}].weight
            i, module, proj = parts[2], parts[3], parts[4]
            if module.endswith("layernorm"):
                gname, qtype = f"blk.{i}.{'attn_norm' if module.startswith('input') else 'ffn_norm'}.weight", Q.F32
            else:
                gname, qtype = f"blk.{i}.{layer_types[proj][0]}.weight", layer_types[proj][1]
                if proj in ("q_proj", "k_proj"):
                    w = llama_cpp_permute(w, HEADS if proj == "q_proj" else KV_HEADS)
        if qtype in (Q.Q4_K, Q.Q6_K):
            data = random_kquant_bytes(*w.shape, qtype, rng)
        elif qtype == Q.F32:
            data = w.astype(np.float32)
        else:
            data = quants.quantize(w.astype(np.float32), qtype)
        writer.add_tensor(gname, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    ref = LlamaForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf", dtype=torch.float32).eval()
    tokens = [5, 77, 300, 12, 9, 255, 400, 1, 2, 3]
    with torch.no_grad():
        expected = ref(torch.tensor([tokens])).logits[0]
    assert (our_logits(str(tmp_path / "m.gguf"), tokens) - expected).abs().max().item() <= 1e-3


def test_missing_model_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="smollm2-135m-instruct"):
        load_model(str(tmp_path / "nope.gguf"))


def test_unsupported_architecture_is_typed(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(hf_config("GPT2LMHeadModel")))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        load_model(str(tmp_path))


def test_unsupported_gguf_architecture_and_quant_are_typed(tmp_path: Path) -> None:
    import gguf
    from gguf.constants import GGMLQuantizationType as Q

    def write(arch: str, qtype) -> Path:
        path = tmp_path / f"{arch}-{qtype.name}.gguf"
        w = gguf.GGUFWriter(str(path), arch)
        for key, value in [("block_count", 1), ("embedding_length", 256), ("feed_forward_length", 256),
                           ("attention.head_count", 4), ("context_length", 64), ("vocab_size", 4)]:
            w.add_uint32(f"{arch}.{key}", value)
        block, size = gguf.constants.GGML_QUANT_SIZES[qtype]
        w.add_tensor("token_embd.weight", np.zeros((4, 256 // block * size), dtype=np.uint8), raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path

    with pytest.raises(UnsupportedModelError, match="gpt2"):
        load_model(str(write("gpt2", Q.Q8_0)))
    with pytest.raises(UnsupportedModelError, match="IQ2_XXS"):
        load_model(str(write("llama", Q.IQ2_XXS)))


def test_prompt_longer_than_context_is_typed(tiny_float) -> None:
    with pytest.raises(PromptTooLongError, match="context window"):
        check_prompt_fits(tiny_float.config, tiny_float.config.max_position)
    check_prompt_fits(tiny_float.config, tiny_float.config.max_position - 1)


@pytest.mark.parametrize(("weights", "kernel", "kv_dtype", "stored"), [
    ("int8", "vnni", None, torch.float16),      # the default beside quantized weights: half the K/V bytes
    ("int8", "amx", None, torch.float16),
    ("int8", "portable", None, torch.float32),  # no AVX-512: the scalar attention is slower on fp16
    ("int8", "none", None, torch.float32),
    ("float", "vnni", None, torch.float32),     # the fp32 reference keeps an fp32 cache
    ("int8", "vnni", "float32", torch.float32),
    ("int8", "portable", "float16", torch.float16),
    ("int8", "vnni", "bfloat16", torch.bfloat16),
])
def test_kv_cache_dtype_default_and_override(weights: str, kernel: str, kv_dtype: str | None, stored: torch.dtype,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from interlock.kernels import native

    monkeypatch.setattr(native, "int8_kernel", lambda: kernel)     # what the loader asks of this CPU
    lm = load_model("tiny", weights=weights, kv_dtype=kv_dtype)   # type: ignore[arg-type]
    kv = PagedKVCache(lm.config, num_blocks=2, block_size=4)
    assert kv.k.dtype == kv.v.dtype == stored


HUB_CHECK = """\
import json, sys
import torch
from interlock.models.loader import load_model
from interlock.protocol.errors import ModelNotFoundError

hub, direct = load_model("test-org/tiny-llama", weights="float"), load_model(sys.argv[1], weights="float")
weights = list(zip(hub.model.state_dict().values(), direct.model.state_dict().values()))
out = {"same_weights": len(weights) > 0 and all(torch.equal(a, b) for a, b in weights),
       "path": hub.tokenizer.hf.name_or_path, "eos": list(hub.tokenizer.eos_token_ids), "n_layers": hub.config.n_layers}
try:
    load_model("test-org/not-in-the-cache")
except ModelNotFoundError as exc:
    out["missing"] = str(exc)
print(json.dumps(out))
"""


def test_a_hub_id_loads_from_the_hub_cache_offline(tmp_path: Path) -> None:
    """A hub id resolves through huggingface_hub to its snapshot in the cache (a cache this test lays
    out as the hub does: models--owner--name/{refs/main, snapshots/<commit>/...}); with
    HF_HUB_OFFLINE=1 nothing is fetched, and an id that is not cached is a typed error."""
    import os
    import subprocess
    import sys

    from interlock.parallel.process import child_env

    cfg = hf_config()
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--test-org--tiny-llama"
    snapshot = save_hf_dir(random_hf_model(cfg), repo / "snapshots" / commit, cfg)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    direct = save_hf_dir(random_hf_model(cfg), tmp_path / "direct", cfg)
    env = {**child_env(), "HF_HOME": str(tmp_path / "home"), "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", HUB_CHECK, str(direct)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["same_weights"] and out["n_layers"] == LAYERS and out["eos"] == [1]
    assert os.path.samefile(out["path"], snapshot)
    assert "'test-org/not-in-the-cache' is not in the Hugging Face cache" in out["missing"]
    assert "HF_HUB_OFFLINE" in out["missing"]


@pytest.mark.parametrize(("text", "hub"), [("Qwen/Qwen2.5-0.5B-Instruct", True), ("HuggingFaceTB/SmolLM2-135M", True),
                                          ("tiny", False), ("a/b/c", False), ("./model", False), ("../x", False),
                                          ("/abs/path", False), ("org/", False)])
def test_what_counts_as_a_hub_id(text: str, hub: bool) -> None:
    from interlock.models.hub import is_hub_id

    assert is_hub_id(text) is hub
