"""Quantized models straight from a GGUF (models/packed.py): "auto" picks int4 for a 4-bit file, the
cache a warm start maps gives the bits the conversion gave, and int4 keeps the forward's laws."""
from __future__ import annotations

import pytest
import torch

from interlock.kernels import native
from interlock.models.batch import SeqChunk, build_batch
from interlock.models.kv_cache import PagedKVCache
from interlock.models.linear import Int4Linear, Int8Linear
from interlock.models.loader import EMBEDDED, INT4_FROM_BYTES, embedded_gguf_path, load_model, resolve_weights
from interlock.models import packed
from interlock.testing.greedy import greedy_generate

needs_native = pytest.mark.skipif(not native.available(), reason="int4 needs the native kernels")
PROMPT = "The capital of France is"


def logits(loaded, ids: list[int]) -> torch.Tensor:
    kv = PagedKVCache(loaded.config, num_blocks=8)
    kv.add_sequence(0)
    kv.reserve(0, len(ids))
    return loaded.model(build_batch([SeqChunk(0, tuple(ids), 0, tuple(range(len(ids))))], kv), kv)


@needs_native
def test_auto_is_int4_for_a_big_gguf_and_int8_for_a_small_one_and_tiny(tmp_path) -> None:
    big = tmp_path / "big.gguf"
    with open(big, "wb") as f:                                    # sparse: only its size is read
        f.truncate(INT4_FROM_BYTES)
    assert resolve_weights(big, "auto") == "int4"
    assert resolve_weights(embedded_gguf_path(), "auto") == "int8"        # 98 MB: bound by compute
    assert resolve_weights(embedded_gguf_path(), "int4") == "int4"
    assert load_model("tiny").model.weights == "int8"


@needs_native
def test_a_warm_start_maps_what_the_conversion_wrote(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))        # a cold cache: the file is converted
    cold = load_model(EMBEDDED, weights="int4")
    entry = packed._entry(embedded_gguf_path(), "int4")
    assert (entry / "model.pt").is_file() and (entry / "layer-0.pt").is_file()
    warm = load_model(EMBEDDED, weights="int4")
    ids = cold.tokenizer.encode_prompt(PROMPT)
    assert torch.equal(logits(cold, ids), logits(warm, ids))
    lin = warm.model._linears[0]
    # Q4_1 projections are int4 from their blocks; the head is int8 rows
    assert all(isinstance(m, Int4Linear) for m in lin.values()) and isinstance(warm.model._head, Int8Linear)
    assert warm.model._head.dense_weight is None                 # no float copy of anything kept


@needs_native
def test_int4_answers_like_the_float_model() -> None:
    floats, int4 = load_model(EMBEDDED, weights="float"), load_model(EMBEDDED, weights="int4")
    ids = floats.tokenizer.encode_prompt(PROMPT)
    assert greedy_generate(int4.model, ids, 2) == greedy_generate(floats.model, ids, 2)   # " Paris."
    lf, l4 = logits(floats, ids).log_softmax(-1), logits(int4, ids).log_softmax(-1)
    top5 = lf.topk(5, dim=-1).indices
    # measured 0.58 nats over four prompts (int8 rows: 0.63): docs/models.md
    assert (l4.gather(-1, top5) - lf.gather(-1, top5)).abs().max().item() <= 0.75


@needs_native
def test_int4_rows_alone_equal_rows_in_a_batch_and_prompt_chunks_equal_decode_rows() -> None:
    # batch invariance: what makes speculative == plain and a prefix-cache hit exact under int4
    m = load_model(EMBEDDED, weights="int4")
    ids = m.tokenizer.encode_prompt(PROMPT)
    whole = logits(m, ids)
    kv = PagedKVCache(m.config, num_blocks=8)
    kv.add_sequence(0)
    rows = []
    for i, t in enumerate(ids):                                   # one token a step
        kv.reserve(0, 1)
        rows.append(m.model(build_batch([SeqChunk(0, (t,), i, (0,))], kv), kv))
    assert torch.equal(torch.cat(rows), whole)


def test_a_conversion_in_slices_gives_the_bits_of_whole_tensors(monkeypatch) -> None:
    # the bounded-memory conversion (slices of rows, the embedding and head in chunks) must write
    # exactly what dequantizing and quantizing whole tensors writes
    from gguf import quants

    from interlock.kernels.int4_pack import from_gguf
    from interlock.models.checkpoint import CheckpointReader, Layout
    from interlock.models.gguf_file import GGUFFile
    from interlock.models.gguf_loader import _field, read_config, unpermute
    from interlock.models.linear import quantize_int8

    reader = GGUFFile(embedded_gguf_path())
    config, _ = read_config(reader, "float32")
    src = packed.GGUFSource(reader, _field(reader, "general.architecture"), config)
    ckpt = CheckpointReader(src, Layout(config))

    def whole(name: str):
        t = src.tensors[name]
        return torch.from_numpy(quants.dequantize(t.data, t.tensor_type).astype("float32"))

    embed_name, q_name = ckpt.layout.where("embed")[0], ckpt.layout.where("q", 0)[0]
    assert torch.equal(src.rows(embed_name, 100, 2000), whole(embed_name)[100:2000])
    heads = config.n_heads                                 # llama.cpp permuted q: read whole, then sliced
    assert torch.equal(src.rows(q_name, 64, 192), torch.from_numpy(unpermute(whole(q_name).numpy(), heads))[64:192])
    monkeypatch.setattr(packed, "_CHUNK", 1000)           # 49,152 rows: 50 chunks, the last one short
    embed = packed._embedding(ckpt, config)
    assert torch.equal(embed, whole(embed_name))
    q, s = packed._head(ckpt, config, embed)
    q_whole, s_whole = quantize_int8(whole(embed_name))
    assert torch.equal(q, q_whole) and torch.equal(s, s_whole)
    gate = ckpt.layout.where("gate", 0)[0]                 # not permuted: only rows [64, 128) are unpacked
    t = src.tensors[gate]
    records, offsets = from_gguf(t.data, src.kind(gate), int(t.shape[1]), int(t.shape[0]))
    part = src.int4(gate, 64, 128)
    assert (part[0] == records[64:128]).all() and (part[1] == offsets[64:128]).all()
