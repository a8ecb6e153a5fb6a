"""Qwen3, Gemma 3, Phi-3 and Phi-4-mini against transformers itself (testing/families.py builds tiny
random-weight models of each with Qwen3ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM and saves
them as safetensors directories; nothing is downloaded):

- float32 weights: the prompt's logits within 1e-4 of transformers', and greedy decoding equal token
  for token over prompts and outputs that cross Gemma 3's and Phi-3's sliding windows (prefill on the
  SDPA path, decode rows on the native row attention);
- int8 weights (the CPU engine's default: the native rows path): each token's log-probability within
  INT8_LOGPROB_TOL of transformers' along transformers' own greedy output;
- a GGUF written with the `gguf` package as llama.cpp lays out that architecture: the same logits as
  the directory;
- a skipped norm (a planted bug) moves the logits far past the tolerance: the comparison can fail.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from interlock.kernels import native
from interlock.models.batch import SeqChunk, build_batch
from interlock.models.hf_loader import config_from_hf
from interlock.models.kv_cache import PagedKVCache
from interlock.models.loader import LoadedModel, load_model
from interlock.testing.families import FAMILIES, GEMMA3_EOT, hf_model, save_dir, write_gguf
from interlock.testing.greedy import greedy_generate

# One worker runs the whole module (`make test` is --dist loadgroup), so that its module fixtures
# (the checkpoints) are built once, not once on each worker.
pytestmark = pytest.mark.xdist_group("model-families")

FLOAT_TOL = 1e-4            # fp32 against fp32: only the order of operations differs
INT8_LOGPROB_TOL = 0.15     # int8 weights and activations (models/linear.py) against fp32, per token, in nats
                            # (measured: at most 0.08, Phi-4-mini's shape)
PROMPT = [(i * 37 + 11) % 1000 + 5 for i in range(20)]      # 20 tokens: past the 8- and 16-key windows
NEW = 24                    # greedy tokens: Phi-4-mini's longrope switches to its long factors at position 32


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, tuple[torch.nn.Module, Path]]:
    root = tmp_path_factory.mktemp("families")
    return {name: (model := hf_model(name), save_dir(model, root / name)) for name in FAMILIES}


def logits_of(lm: LoadedModel, tokens: list[int]) -> torch.Tensor:
    kv = PagedKVCache(lm.config, num_blocks=16, block_size=16)
    kv.add_sequence(0)
    kv.reserve(0, len(tokens))
    return lm.model(build_batch([SeqChunk(0, tuple(tokens), 0, tuple(range(len(tokens))))], kv), kv)


@torch.no_grad()
def hf_greedy(model: torch.nn.Module, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens and the log-softmax row that chose each, one cached step at a
    time (HF generate would drop Phi-3's cache to recompute everything with the long factors once
    the sequence passes original_max_position: docs/models.md says why interlock does not)."""
    out = model(torch.tensor([prompt]), use_cache=True)
    tokens, rows = [], []
    for _ in range(n):
        row = out.logits[0, -1].log_softmax(-1)
        tokens.append(int(row.argmax()))
        rows.append(row)
        out = model(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens, torch.stack(rows)


@pytest.mark.parametrize("name", FAMILIES)
def test_float_logits_match_transformers(name: str, built) -> None:
    model, path = built[name]
    with torch.no_grad():
        expected = model(torch.tensor([PROMPT])).logits[0]
    got = logits_of(load_model(str(path), weights="float"), PROMPT)
    assert (got - expected).abs().max().item() <= FLOAT_TOL


@pytest.mark.parametrize("name", FAMILIES)
def test_float_greedy_matches_transformers_token_for_token(name: str, built) -> None:
    model, path = built[name]
    expected, _ = hf_greedy(model, PROMPT, NEW)
    assert len(set(expected)) >= 6, f"random weights too weak: greedy output {expected}"
    assert greedy_generate(load_model(str(path), weights="float").model, PROMPT, NEW) == expected


@pytest.mark.skipif(not native.available(), reason="the int8 rows path needs the native kernels (a C++ compiler)")
@pytest.mark.parametrize("name", FAMILIES)
def test_int8_logprobs_within_tolerance(name: str, built) -> None:
    """Teacher-forced along transformers' greedy output: the prompt through the dense path, each new
    token through the native rows path (rows_forward), as the engine decodes."""
    model, path = built[name]
    tokens, rows = hf_greedy(model, PROMPT, NEW)
    lm = load_model(str(path), weights="int8")
    assert lm.model.fused_rows is not None                    # the native rows path, not the torch loop
    kv = PagedKVCache(lm.config, num_blocks=16, block_size=16)
    kv.add_sequence(0)
    kv.reserve(0, len(PROMPT))
    ours = [lm.model(build_batch([SeqChunk(0, tuple(PROMPT), 0, (len(PROMPT) - 1,))], kv), kv)[0]]
    for t in tokens[:-1]:
        ours.append(lm.model(build_batch([SeqChunk(0, (t,), kv.reserve(0, 1), (0,))], kv), kv)[0])
    ours_lp = torch.stack(ours).log_softmax(-1)
    picked = torch.tensor(tokens)[:, None]
    err = (ours_lp.gather(1, picked) - rows.gather(1, picked)).abs()
    assert err.max().item() <= INT8_LOGPROB_TOL, err.flatten().tolist()


@pytest.mark.parametrize("name", ["qwen3", "gemma3-gguf", "phi3", "phi4-mini"])
def test_gguf_gives_the_directory_logits(name: str, built, tmp_path: Path) -> None:
    """The same weights as llama.cpp's converter writes them (Gemma's norms as 1 + w, Phi-3's fused
    tensors and longrope factor tensors); gemma3-gguf keeps what llama.cpp fixes for gemma3."""
    model = built[name][0] if name in built else hf_model(name)
    path = built[name][1] if name in built else save_dir(model, tmp_path / name)
    gguf_path = write_gguf(model, tmp_path / f"{name}.gguf")
    direct, from_gguf = load_model(str(path), weights="float"), load_model(str(gguf_path), weights="float")
    assert from_gguf.config.family == direct.config.family
    assert (GEMMA3_EOT in from_gguf.tokenizer.eos_token_ids) == name.startswith("gemma3")     # end of turn stops
    assert (logits_of(from_gguf, PROMPT) - logits_of(direct, PROMPT)).abs().max().item() <= 1e-5


@pytest.mark.parametrize(("name", "norm"), [("qwen3", "k_norm"), ("gemma3", "post_attention_norm"),
                                            ("gemma3", "q_norm"), ("phi4-mini", "ffn_norm")])
def test_a_skipped_norm_is_caught(name: str, norm: str, built) -> None:
    """The planted bug: one norm of one layer left out (its weight set to ones, and for Gemma's post
    norm the norm itself skipped) moves the logits far past FLOAT_TOL."""
    model, path = built[name]
    lm = load_model(str(path), weights="float")
    layer = lm.model.layers[0]
    if norm == "post_attention_norm":
        layer.post_attention_norm = None                    # the forward then adds the raw attention output
    else:
        getattr(layer, norm).data.fill_(1.0)
    with torch.no_grad():
        expected = model(torch.tensor([PROMPT])).logits[0]
    assert (logits_of(lm, PROMPT) - expected).abs().max().item() > 100 * FLOAT_TOL


def test_hub_and_transformers5_configs_agree(built) -> None:
    """Gemma 3's config.json as the hub has it (rope_scaling, rope_local_base_freq, sliding_window_pattern)
    and as transformers 5 writes it (rope_parameters per layer type, layer_types) give one ModelConfig."""
    written = json.loads((built["gemma3"][1] / "config.json").read_text())
    hub = {k: v for k, v in written.items() if k not in ("rope_parameters", "layer_types")}
    hub.update(rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, sliding_window_pattern=3,
               rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert config_from_hf(hub, "float32") == config_from_hf(written, "float32")


def test_unsupported_variants_are_refused_by_name() -> None:
    from interlock.protocol.errors import UnsupportedModelError

    base = {"architectures": ["Phi3ForCausalLM"], "vocab_size": 64, "hidden_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 128}
    with pytest.raises(UnsupportedModelError, match="yarn"):
        config_from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "float32")
    with pytest.raises(UnsupportedModelError, match="PhiMoEForCausalLM"):
        config_from_hf({**base, "architectures": ["PhiMoEForCausalLM"]}, "float32")
    with pytest.raises(UnsupportedModelError, match="final_logit_softcapping"):
        config_from_hf({**base, "architectures": ["Gemma3ForCausalLM"], "final_logit_softcapping": 30.0}, "float32")


def device_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding on the device forward (models/device_llama.py): the prompt in one step, then
    one row per step, every step's inputs as fixed-shape StepInputs with padding rows."""
    from interlock.models.device_llama import step_inputs

    kv = PagedKVCache(model.config, num_blocks=32, block_size=4, device=model.device)
    kv.add_sequence(999)
    kv.reserve(999, 4)                                   # block 0: the padding rows' slot
    kv.add_sequence(0)

    def step(tokens: list[int]) -> torch.Tensor:
        start = kv.reserve(0, len(tokens))
        rows = -(-len(tokens) // 8) * 8
        inputs = step_inputs([SeqChunk(0, tuple(tokens), start, ())], kv, rows=rows, max_blocks=16, pad_slot=0,
                             device=model.device)
        return model(inputs, kv)[len(tokens) - 1]

    out = [int(step(prompt).argmax())]
    while len(out) < n:
        out.append(int(step([out[-1]]).argmax()))
    return out


@pytest.mark.parametrize("name", FAMILIES)
def test_device_runner_float32_greedy_matches_transformers(name: str, built) -> None:
    """The device runner's forward on the CPU (float32, the torch reference ops the CUDA engine's
    Triton kernels follow): transformers' greedy tokens, token for token, across the windows."""
    from interlock.models.device_llama import DeviceLlama

    model, path = built[name]
    expected, _ = hf_greedy(model, PROMPT, NEW)
    device = DeviceLlama.from_transformer(load_model(str(path), weights="float").model, "cpu", torch.float32,
                                          gemm_rows=8)
    assert device_greedy(device, PROMPT, NEW) == expected


def test_stop_ids_include_the_generation_configs(built, tmp_path: Path) -> None:
    """Gemma 3 ends a chat turn with <end_of_turn> and Phi-3 with <|end|>: generation_config.json lists
    them beside the tokenizer's eos, and generation stops at any of them."""
    from interlock.models.tokenizer import load_hf_tokenizer

    path = save_dir(built["gemma3"][0], tmp_path / "gemma3")
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7, 2, 5000]}))
    assert load_hf_tokenizer(path).eos_token_ids == (2, 7)            # 5000: outside the tokenizer


@pytest.mark.parametrize("prefix", ["model.language_model.", "language_model.model."])
def test_a_multimodal_gemma3_checkpoint_loads_its_text_model(prefix: str, built, tmp_path: Path) -> None:
    """Gemma 3 4B-27B ship as Gemma3ForConditionalGeneration: the text model's config under text_config
    (leaving out what equals Gemma3TextConfig's defaults) and its tensors under a prefix (transformers 5's,
    or the hub's older one), beside a vision tower that is not read."""
    import shutil

    from safetensors.torch import load_file, save_file

    text_dir = built["gemma3"][1]
    shutil.copytree(text_dir, tmp_path / "mm")
    state = load_file(str(text_dir / "model.safetensors"))
    renamed = {prefix + k.removeprefix("model."): v for k, v in state.items()}
    renamed["vision_tower.vision_model.post_layernorm.weight"] = torch.zeros(8)
    (tmp_path / "mm" / "model.safetensors").unlink()
    save_file(renamed, str(tmp_path / "mm" / "model.safetensors"))
    text = json.loads((text_dir / "config.json").read_text())
    text.pop("architectures")
    text["rms_norm_eps"] = text.pop("rms_norm_eps")          # kept: it is not the default
    text.pop("tie_word_embeddings")                          # left out: it equals the default
    (tmp_path / "mm" / "config.json").write_text(json.dumps(
        {"architectures": ["Gemma3ForConditionalGeneration"], "text_config": text, "eos_token_id": 2}))
    direct, multimodal = load_model(str(text_dir), weights="float"), load_model(str(tmp_path / "mm"), weights="float")
    assert multimodal.config == direct.config
    assert torch.equal(logits_of(multimodal, PROMPT), logits_of(direct, PROMPT))


HUB_LOAD = """\
import sys, torch
from interlock.models.loader import load_model
a, b = load_model("test-org/tiny-qwen3", weights="float"), load_model(sys.argv[1], weights="float")
print(a.config.family, all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values())))
"""


def test_a_hub_id_of_a_new_family_loads_from_the_cache_offline(built, tmp_path: Path) -> None:
    """A Qwen3 checkpoint in the hub cache's layout (models--owner--name/refs, snapshots), read by its
    hub id with HF_HUB_OFFLINE=1: the same model as its directory."""
    import shutil
    import subprocess
    import sys

    from interlock.parallel.process import child_env

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--test-org--tiny-qwen3"
    shutil.copytree(built["qwen3"][1], repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    env = {**child_env(), "HF_HOME": str(tmp_path / "home"), "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", HUB_LOAD, str(built["qwen3"][1])], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["qwen3", "True"]
