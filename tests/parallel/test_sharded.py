"""Sharding math, in one process: each rank's slices, from every kind of source, are exactly the
matching slices of the whole model (no torch.distributed needed)."""
from __future__ import annotations

import pytest
import torch

from interlock.models.llama import random_transformer
from interlock.models.loader import load_model
from interlock.parallel.sharded import Shard, load_shard, local_config
from interlock.models.checkpoint import CheckpointReader, Layout, StateDictSource
from interlock.parallel.shard_sources import hf_state_of, open_source
from interlock.protocol.errors import UnsupportedModelError
from interlock.models.batch import SeqChunk, build_batch
from interlock.models.kv_cache import PagedKVCache
from interlock.parallel.wire import from_wire, to_wire


def expected_slices(full: torch.nn.Module, shard: Shard) -> dict[str, torch.Tensor]:
    """The rank's weights cut out of a whole model by hand (the reference)."""
    c = full.config
    d, w, r = c.head_dim, shard.world, shard.rank
    hl, kl, il = c.n_heads // w, c.n_kv_heads // w, c.intermediate_size // w
    layer = full.layers[-1]
    q, k, v = layer.wqkv.data.split([c.q_size, c.kv_size, c.kv_size])
    gate, up = layer.w13.data.chunk(2)
    vl = -(-c.vocab_size // w)
    return {
        "wqkv": torch.cat([q[r * hl * d:(r + 1) * hl * d], k[r * kl * d:(r + 1) * kl * d],
                           v[r * kl * d:(r + 1) * kl * d]]),
        "wo": layer.wo.data[:, r * hl * d:(r + 1) * hl * d],
        "w13": torch.cat([gate[r * il:(r + 1) * il], up[r * il:(r + 1) * il]]),
        "w2": layer.w2.data[:, r * il:(r + 1) * il],
        "emb": full.tok_embeddings.data[r * vl:(r + 1) * vl],
    }


def check_shard(full: torch.nn.Module, model: torch.nn.Module, shard: Shard) -> None:
    want = expected_slices(full, shard)
    layer = model.layers[-1]
    for name in ("wqkv", "wo", "w13", "w2"):
        assert torch.equal(getattr(layer, name).data, want[name]), name
    emb = model.tok_embeddings.data
    assert torch.equal(emb[: want["emb"].shape[0]], want["emb"])
    assert not emb[want["emb"].shape[0]:].any()            # padding rows of the last rank are zero


@pytest.mark.parametrize("world", [1, 2])
def test_tiny_shards_are_slices_of_the_whole(world: int) -> None:
    config, source, _ = open_source("tiny")
    full = random_transformer(config, seed=0)
    for rank in range(world):
        check_shard(full, load_shard(source, config, Shard(rank, world), weights="float"), Shard(rank, world))


def test_a_padded_vocabulary_gets_zero_rows() -> None:
    config, _, _ = open_source("tiny")
    config = config.replace(vocab_size=1087)                 # not divisible by 2
    full = random_transformer(config, seed=1)
    source = CheckpointReader(StateDictSource(hf_state_of(full)), Layout(config))
    last = load_shard(source, config, Shard(1, 2), weights="float")
    assert last.tok_embeddings.shape[0] == 544
    check_shard(full, last, Shard(1, 2))


def test_sizes_that_do_not_divide_are_refused() -> None:
    config, _, _ = open_source("tiny")                        # 4 heads, 2 KV heads
    with pytest.raises(UnsupportedModelError, match="n_kv_heads"):
        local_config(config, Shard(0, 4))


@pytest.mark.slow
def test_gguf_shards_come_from_the_quantized_bytes() -> None:
    """SmolLM2 (9 heads, 3 KV heads) split 3 ways: slices read from the GGUF bytes and un-permuted
    per head equal the slices of the whole dequantized model, bit for bit."""
    full = load_model("smollm2-135m-instruct", weights="float").model
    config, source, inv_freq = open_source("smollm2-135m-instruct")
    for rank in range(3):
        check_shard(full, load_shard(source, config, Shard(rank, 3), inv_freq, "float"), Shard(rank, 3))


def test_a_batch_survives_the_wire() -> None:
    """What a step sends to the ranks rebuilds the same ForwardBatch, masks of prompt chunks included."""
    config, _, _ = open_source("tiny")
    kv = PagedKVCache(config, 16, 4)
    for seq, n in ((0, 30), (1, 3)):
        kv.add_sequence(seq)
        kv.reserve(seq, n)
    kv.rewind(0, 0)
    batch = build_batch([SeqChunk(0, tuple(range(30)), 0, (29,)), SeqChunk(1, (5, 6, 7), 0, (0, 1, 2))], kv)
    back = from_wire(to_wire(batch))
    for name in ("input_ids", "positions", "write_slots", "logit_index", "row_index"):
        assert torch.equal(getattr(back, name), getattr(batch, name)), name
    assert back.dense == batch.dense
    for a, b in zip(back.seqs, batch.seqs):
        assert (a.offset, a.length, a.start, a.first_slot) == (b.offset, b.length, b.start, b.first_slot)
        assert torch.equal(a.blocks, b.blocks)
        assert (a.mask is None and b.mask is None) or torch.equal(a.mask, b.mask)
    assert batch.seqs[0].mask is not None and batch.seqs[1].mask is None


@pytest.mark.parametrize(("name", "kind"), [("qwen3", "dir"), ("gemma3", "dir"), ("phi4-mini", "dir"),
                                            ("gemma3-gguf", "gguf"), ("phi4-mini", "gguf")])
def test_family_shards_are_slices_of_the_whole(name: str, kind: str, tmp_path) -> None:
    """From an HF directory or a GGUF of each family: Phi-3's fused qkv_proj / gate_up_proj (GGUF:
    attn_qkv, ffn_up) cut by heads and MLP rows, Gemma 3's norms read as 1 + w, q/k norms and
    post-norms whole on every rank."""
    from interlock.testing.families import hf_model, save_dir, write_gguf

    model = hf_model(name)
    path = save_dir(model, tmp_path / name) if kind == "dir" else write_gguf(model, tmp_path / f"{name}.gguf")
    full = load_model(str(path), weights="float").model
    config, source, inv_freq = open_source(str(path))
    for rank in range(2):
        shard = Shard(rank, 2)
        part = load_shard(source, config, shard, inv_freq, "float")
        check_shard(full, part, shard)
        for norm in ("attention_norm", "ffn_norm", "q_norm", "k_norm", "post_attention_norm", "post_ffn_norm"):
            want, got = getattr(full.layers[-1], norm), getattr(part.layers[-1], norm)
            assert (want is None) == (got is None) and (want is None or torch.equal(want.data, got.data)), norm
