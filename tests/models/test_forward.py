"""The packed paged forward against simpler ways of computing the same thing (tiny preset)."""
from __future__ import annotations

import pytest
import torch

from interlock.models.batch import SeqChunk, build_batch
from interlock.models.kv_cache import PagedKVCache
from interlock.models.loader import LoadedModel

PROMPTS = [list(range(40, 40 + 23)), list(range(300, 300 + 5)), [17]]


def run_alone(lm: LoadedModel, tokens: list[int], extra: list[int]) -> torch.Tensor:
    """Prefill `tokens`, then feed `extra` one token per step; logits of every extra step."""
    kv = PagedKVCache(lm.config, num_blocks=32, block_size=4)
    kv.add_sequence(0)
    kv.reserve(0, len(tokens))
    lm.model(build_batch([SeqChunk(0, tuple(tokens), 0, (len(tokens) - 1,))], kv), kv)
    out = []
    for t in extra:
        start = kv.reserve(0, 1)
        out.append(lm.model(build_batch([SeqChunk(0, (t,), start, (0,))], kv), kv))
    return torch.cat(out)


@pytest.mark.parametrize("weights", ["float", "int8"])
def test_packed_batch_equals_each_sequence_alone(weights: str, tiny_float: LoadedModel,
                                                 tiny: LoadedModel) -> None:
    lm = tiny_float if weights == "float" else tiny
    kv = PagedKVCache(lm.config, num_blocks=64, block_size=4)
    # Step 1: all three prompts prefilled in one packed batch (block tables interleave).
    chunks = []
    for seq, prompt in enumerate(PROMPTS):
        kv.add_sequence(seq)
        chunks.append(SeqChunk(seq, tuple(prompt), kv.reserve(seq, len(prompt)), (len(prompt) - 1,)))
    lm.model(build_batch(chunks, kv), kv)
    # Step 2: seq 0 verifies 4 tokens, seq 1 decodes 1, seq 2 gets a 3-token chunk.
    news = [[5, 6, 7, 8], [9], [10, 11, 12]]
    chunks = [SeqChunk(s, tuple(n), kv.reserve(s, len(n)), tuple(range(len(n)))) for s, n in enumerate(news)]
    packed = lm.model(build_batch(chunks, kv), kv)
    offset = 0
    for seq, prompt in enumerate(PROMPTS):
        n = len(news[seq])
        kv2 = PagedKVCache(lm.config, num_blocks=64, block_size=4)
        kv2.add_sequence(0)
        kv2.reserve(0, len(prompt))
        lm.model(build_batch([SeqChunk(0, tuple(prompt), 0, ())], kv2), kv2)
        alone = lm.model(build_batch([SeqChunk(0, tuple(news[seq]), kv2.reserve(0, n), tuple(range(n)))], kv2), kv2)
        torch.testing.assert_close(packed[offset: offset + n], alone, atol=1e-4, rtol=0)
        offset += n


@pytest.mark.parametrize("kv_dtype", ["float16", "float32", "bfloat16"])
def test_int8_rows_are_bitwise_batch_invariant(kv_dtype: str, tiny: LoadedModel) -> None:
    """A token's logits do not depend on what else is in its forward: the basis of exact speculation."""
    from interlock.models.loader import load_model

    lm = tiny if kv_dtype == tiny.config.cache_dtype else load_model("tiny", kv_dtype=kv_dtype)
    assert lm.config.cache_dtype == kv_dtype
    prompt, extra = PROMPTS[0], [5, 6, 7, 8]
    one_by_one = run_alone(lm, prompt, extra)
    kv = PagedKVCache(lm.config, num_blocks=64, block_size=4)
    kv.add_sequence(0)
    kv.reserve(0, len(prompt))
    lm.model(build_batch([SeqChunk(0, tuple(prompt), 0, ())], kv), kv)
    # A verify-style chunk of 4 rows, packed with another sequence's 20-token prefill.
    kv.add_sequence(1)
    other = SeqChunk(1, tuple(range(500, 520)), kv.reserve(1, 20), (19,))
    verify = SeqChunk(0, tuple(extra), kv.reserve(0, 4), (0, 1, 2, 3))
    packed = lm.model(build_batch([other, verify], kv), kv)[1:]
    assert torch.equal(packed, one_by_one)


@pytest.mark.parametrize("weights", ["float", "int8"])
def test_rewind_of_rejected_positions_is_as_if_never_written(weights: str, tiny_float: LoadedModel,
                                                             tiny: LoadedModel) -> None:
    lm = tiny_float if weights == "float" else tiny
    prompt, k, accepted = PROMPTS[0], 5, 2
    kv = PagedKVCache(lm.config, num_blocks=32, block_size=4)
    kv.add_sequence(0)
    kv.reserve(0, len(prompt))
    lm.model(build_batch([SeqChunk(0, tuple(prompt), 0, ())], kv), kv)
    drafts = (900, 901, 902, 903, 904)
    lm.model(build_batch([SeqChunk(0, drafts, kv.reserve(0, k), tuple(range(k)))], kv), kv)
    kv.rewind(0, k - accepted)            # keep 900, 901
    after = lm.model(build_batch([SeqChunk(0, (77,), kv.reserve(0, 1), (0,))], kv), kv)
    expected = run_alone(lm, prompt, [900, 901, 77])[-1:]
    if weights == "int8":
        assert torch.equal(after, expected)
    else:
        torch.testing.assert_close(after, expected, atol=1e-4, rtol=0)


def test_logit_rows_select_only_requested_rows(tiny_float: LoadedModel) -> None:
    lm = tiny_float
    kv = PagedKVCache(lm.config, num_blocks=16, block_size=4)
    kv.add_sequence(0)
    kv.reserve(0, 6)
    all_rows = lm.model(build_batch([SeqChunk(0, (1, 2, 3, 4, 5, 6), 0, tuple(range(6)))], kv), kv)
    kv.rewind(0, 6)
    kv.reserve(0, 6)
    some = lm.model(build_batch([SeqChunk(0, (1, 2, 3, 4, 5, 6), 0, (1, 4))], kv), kv)
    assert some.shape == (2, lm.config.vocab_size)
    # Float weights: BLAS may pick another kernel for 2 rows than for 6 (MKL on Zen 4 does), so the
    # last bits can differ; the int8 rows path is the one held to bit-identity (tests above).
    torch.testing.assert_close(some, all_rows[[1, 4]], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_float_weights_track_fp32(dtype: str, tiny_float: LoadedModel) -> None:
    """The float path in bf16/fp16 runs end to end and stays close to fp32 (norms in fp32)."""
    from interlock.models.loader import load_model

    half = load_model("tiny", weights="float", dtype=dtype)
    assert half.model.tok_embeddings.dtype == getattr(torch, dtype)
    got = run_alone(half, PROMPTS[0], [5, 6, 7])
    want = run_alone(tiny_float, PROMPTS[0], [5, 6, 7])
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    cos = torch.nn.functional.cosine_similarity(got, want, dim=-1)
    assert (cos > 0.99).all(), cos


def test_fused_rows_track_the_torch_layer_loop(tiny: LoadedModel) -> None:
    """The native one-call path for decode / verify rows computes what the torch layer loop computes."""
    from interlock.kernels import native

    lm = tiny
    assert (lm.model.fused_rows is not None) == native.available()      # the tiny int8 model takes it
    saved, prefill = lm.model.fused_rows, lm.model.rows_prefill
    lm.model.rows_prefill = False          # both prefill the prompt the same way: compare the rows
    try:
        fused = run_alone(lm, PROMPTS[0], [5, 6, 7, 8])
        lm.model.fused_rows = None
        loop = run_alone(lm, PROMPTS[0], [5, 6, 7, 8])
    finally:
        lm.model.fused_rows, lm.model.rows_prefill = saved, prefill
    torch.testing.assert_close(fused, loop, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("cuts", [(), (12,), (4, 36), (1, 2, 3)])
def test_rows_prefill_is_bitwise_the_same_for_any_chunking(tiny: LoadedModel, cuts: tuple[int, ...]) -> None:
    """Prompt chunks through the rows path (what lets a prefix-cache hit start at any block): the
    K/V and the next steps' logits do not depend on where the prompt was cut. 40 tokens: above
    the dense path's threshold, so without rows_prefill the one-chunk prefill would take it."""
    from interlock.kernels import native

    if not native.available():
        pytest.skip("no C++ compiler: no rows path")
    lm = tiny
    prompt, extra = list(range(100, 140)), [5, 6, 7]

    def run(cut_at: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        kv = PagedKVCache(lm.config, num_blocks=32, block_size=4)
        kv.add_sequence(0)
        for a, b in zip((0, *cut_at), (*cut_at, len(prompt))):
            lm.model(build_batch([SeqChunk(0, tuple(prompt[a:b]), kv.reserve(0, b - a), ())], kv), kv)
        logits = torch.cat([lm.model(build_batch([SeqChunk(0, (t,), kv.reserve(0, 1), (0,))], kv), kv)
                            for t in extra])
        slots = torch.tensor([s for b in kv.block_table(0) for s in range(b * 4, b * 4 + 4)][: len(prompt)])
        return logits, kv.k[:, slots], kv.v[:, slots]

    saved = lm.model.rows_prefill
    lm.model.rows_prefill = True          # also where the CPU has no AMX (the VNNI kernels)
    try:
        whole, cut = run(()), run(cuts)
    finally:
        lm.model.rows_prefill = saved
    for a, b in zip(whole, cut):
        assert torch.equal(a, b)
