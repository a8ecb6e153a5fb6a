"""benchmarks/shape_gguf.py and shapes.py: the random-weight GGUFs load in interlock and give finite
logits, their matrices get llama.cpp's Q4_K_M types, and the harness's bookkeeping (arguments,
bytes per token) says what the report claims. No timing is asserted."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from interlock.benchmarks import shape_gguf
from interlock.benchmarks.shape_gguf import SHAPES, Shape, tensor_type
from interlock.benchmarks.shapes import decode_nbytes, parse_args, prompt_ids, torch_extensions_dir
from interlock.models.batch import SeqChunk, build_batch
from interlock.models.kv_cache import PagedKVCache
from interlock.models.loader import load_model

# Small enough to write and load in a second or two, with every block type and both families.
TINY = {
    "llama": Shape("tiny-llama", "llama", hidden=256, layers=8, heads=4, kv_heads=2, ffn=512, vocab=1088,
                   tied=False, head_dim=64, rope_theta=500000.0, llama3_rope=8.0, tokenizer_vocab=1024),
    "qwen2": Shape("tiny-qwen2", "qwen2", hidden=256, layers=4, heads=4, kv_heads=2, ffn=768, vocab=1088,
                   tied=True, qkv_bias=True, head_dim=64, rms_eps=1e-6, tokenizer_vocab=1024),
}


@pytest.fixture
def own_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Converted weights and tokenizers go to tmp_path; the native kernels' build stays where it is."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", torch_extensions_dir())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _logits(path: Path, weights: str) -> torch.Tensor:
    loaded = load_model(str(path), weights=weights)
    ids = loaded.tokenizer.encode("The capital of France is")
    kv = PagedKVCache(loaded.model.config, num_blocks=2, block_size=16)
    kv.add_sequence(0)
    start = kv.reserve(0, len(ids))
    return loaded.model(build_batch([SeqChunk(0, tuple(ids), start, tuple(range(len(ids))))], kv), kv)


@pytest.mark.parametrize(("arch", "file_type"), [("llama", "Q4_K_M"), ("qwen2", "Q8_0")])
def test_written_file_loads_with_finite_logits(arch: str, file_type: str, tmp_path: Path, own_caches: None) -> None:
    shape = TINY[arch]
    path = shape_gguf.write_gguf(tmp_path / shape_gguf.file_name(shape, file_type), shape, file_type)
    planned = {name: kind for name, kind, _ in shape_gguf.planned_tensors(shape, file_type)}
    assert dict(shape_gguf.iter_types(path)) == planned
    logits = _logits(path, "int8")
    assert logits.shape[1] == shape.vocab and torch.isfinite(logits).all()
    assert 0.05 < float(logits.std()) < 10.0            # the scales keep activations sane, not degenerate


def test_dequantized_blocks_have_the_intended_spread() -> None:
    from gguf import GGMLQuantizationType, quants

    rng = np.random.default_rng(0)
    for kind in ("Q8_0", "Q4_K", "Q6_K"):
        w = quants.dequantize(shape_gguf.random_matrix(kind, 16, 512, rng), GGMLQuantizationType[kind])
        assert w.shape == (16, 512) and np.isfinite(w).all()
        assert abs(float(w.mean())) < 0.002 and 0.015 < float(w.std()) < 0.025


def test_q4_k_m_types_follow_llama_cpp() -> None:
    one_b, three_b, eight_b = SHAPES["1b"], SHAPES["3b"], SHAPES["8b"]

    def kind(shape: Shape, name: str) -> str:
        return tensor_type(name, "Q4_K_M", shape.layers, shape.tied)

    # 16 layers: use_more_bits picks 0, 1 (i < 2), 4, 7, 10, 13 ((i - 2) % 3 == 2) and 14, 15 (i >= 14).
    more = [i for i in range(16) if kind(one_b, f"blk.{i}.ffn_down.weight") == "Q6_K"]
    assert more == [0, 1, 4, 7, 10, 13, 14, 15]
    assert [i for i in range(16) if kind(one_b, f"blk.{i}.attn_v.weight") == "Q6_K"] == more
    assert {kind(one_b, f"blk.{i}.{m}.weight") for i in range(16)
            for m in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up")} == {"Q4_K"}
    assert kind(one_b, "token_embd.weight") == "Q6_K"          # tied: the embedding is the output
    assert kind(eight_b, "token_embd.weight") == "Q4_K" and kind(eight_b, "output.weight") == "Q6_K"
    # 36 layers: i < 4, i >= 31, (i - 4) % 3 == 2.
    assert [i for i in range(36) if kind(three_b, f"blk.{i}.ffn_down.weight") == "Q6_K"] == \
        [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 31, 32, 33, 34, 35]
    assert {tensor_type(name, "Q8_0", 16, True) for name, _, _ in shape_gguf.matrices(one_b)} == {"Q8_0"}
    with pytest.raises(ValueError):
        tensor_type("blk.0.attn_q.weight", "Q4_0", 16, True)


def test_decode_bytes_count_the_kernel_weights_not_the_prompt_copy() -> None:
    from interlock.models.linear import Int8Linear

    lin = Int8Linear(torch.randn(64, 128), torch.zeros(64))
    # int8 values, fp32 scales (the bf16 copy of them and the bf16 dense weight are not read), fp32 bias
    assert decode_nbytes(lin) == 64 * 128 + 64 * 4 + 64 * 4

    class Own(torch.nn.Module):
        def decode_nbytes(self) -> int:
            return 7

    assert decode_nbytes(Own()) == 7


def test_arguments_and_prompts() -> None:
    args = parse_args(["--shapes", "1b,8b", "--weights", "int8,q4k", "--skip-llama-cpp"])
    assert args.shapes == ["1b", "8b"] and args.weights == ["int8", "q4k"] and args.skip_llama_cpp
    assert parse_args([]).shapes == ["1b"] and parse_args([]).weights == ["int8", "int4"]
    for bad in (["--shapes", "2b"], ["--tokens", "1"], ["--interlock-files", "Q5_K_M"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
    ids = prompt_ids(256, 1, 128256)
    assert ids == prompt_ids(256, 1, 128256) and all(17 <= i < 49152 for i in ids)
    assert all(0 <= i < 1088 for i in prompt_ids(64, 1, 1088))


class FakeWorker:
    """Answers decode / prefill with scripted core shares (what Runs.alternate decides on)."""

    def __init__(self, shares: list[float]) -> None:
        self.shares, self.asked = shares, 0

    def ask(self, command: str) -> dict[str, float]:
        if command == "decode":
            self.asked += 1
            share = self.shares[min(self.asked, len(self.shares)) - 1]
            return {"decode_tok_s": 10.0 * share, "decode_core_share": share}
        return {"prefill_tok_s": 100.0, "prefill_core_share": 1.0}


@pytest.mark.parametrize(("shares", "rounds"), [([1.0], 3), ([0.5], 7), ([0.5, 0.5, 1.0, 1.0, 1.0, 1.0], 4)])
def test_repeats_go_on_until_half_were_quiet(shares: list[float], rounds: int) -> None:
    from interlock.benchmarks.shapes import REFERENCE, Runs, summarize

    runs = Runs()
    runs.system(REFERENCE, "Q4_K_M")
    s = runs.system("interlock int8", "Q4_K_M")
    ours, ref = FakeWorker(shares), FakeWorker([1.0])
    runs.alternate({"interlock int8": ours}, 3, ref, 7)        # type: ignore[dict-item, arg-type]
    assert ours.asked == ref.asked == rounds == len(s["repeats"]) == len(s["paired_ref"])
    summarize(s, runs.systems[REFERENCE], bandwidth=0.0)
    assert s["quiet_decode_tok_s_n"] == sum(r["decode_core_share"] >= 0.9 for r in s["repeats"])
    assert s["best_decode_tok_s"] == 10.0 * max(shares[:rounds])


@pytest.mark.slow         # ~30 s: five children, each importing torch
def test_one_run_end_to_end_at_a_tiny_shape(tmp_path: Path, own_caches: None, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Every child (bandwidth, llama.cpp where it is importable, interlock cold and warm) reports, and
    the saved file and the last line hold the figures the tables show."""
    import json

    from interlock.benchmarks import shapes

    monkeypatch.setitem(shapes.SHAPES, "tiny", TINY["llama"])
    out = tmp_path / "shapes.json"
    shapes.main(["--shapes", "tiny", "--weights", "int8", "--tokens", "3", "--repeats", "1", "--max-repeats", "1",
                 "--prompt", "20", "--llama-cpp-files", "Q4_K_M", "--bandwidth-bytes", str(1 << 22),
                 "--files", str(tmp_path / "files"), "--out", str(out)])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    saved = json.loads(out.read_text())["shapes"]["tiny"]
    systems = {s["system"]: s for s in saved["systems"]}
    ours = systems["interlock int8"]
    assert "error" not in ours and ours["decode_tok_s"] > 0 and ours["prefill_tok_s"] > 0
    assert ours["verify4_over_decode"] > 0 and ours["cold"]["ready_s"] > 0 and ours["info"]["peak_rss_bytes"] > 0
    assert len(ours["info"]["tokens"]) == 3 and ours["of_floor"] > 0
    assert last["tiny interlock int8 Q4_K_M decode_tok_s"] == round(ours["decode_tok_s"], 3)
    if shapes.llama_cpp_importable():
        ref = systems[shapes.REFERENCE]
        assert "error" not in ref and ref["decode_tok_s"] > 0 and ref["decode_tok_s_vs_ref"] == 1.0
        assert ours["decode_tok_s_vs_ref"] > 0 and len(ours["paired_ref"]) == 1
        assert ref["bytes_per_token"] < ours["bytes_per_token"]         # Q4_K / Q6_K blocks against int8
