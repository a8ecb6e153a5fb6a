"""The torch reference ops refuse what their Triton kernels would misread (models/kernel_rules.py):
a strided view, a dtype the kernel does not read, a shape it cannot tile. A head dim that is not a
power of two (Phi-3's 96) runs padded; one too large for the kernel is refused by name."""
from __future__ import annotations

import pytest
import torch

from interlock.models import reference_ops
from interlock.models.batch import SeqChunk
from interlock.models.config import ModelConfig, tiny_config
from interlock.models.kernel_rules import KernelInputError, attention_blocks
from interlock.models.kv_cache import PagedKVCache
from interlock.models.llama import random_transformer
from interlock.protocol.errors import UnsupportedModelError

T, HKV, G, D, BS = 4, 2, 2, 16, 4


def inputs() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return dict(q=torch.randn(T, HKV * G * D, generator=gen), k_cache=torch.randn(32, HKV, D, generator=gen),
                v_cache=torch.randn(32, HKV, D, generator=gen), tables=torch.arange(8, dtype=torch.int32)[None],
                row_table=torch.zeros(T, dtype=torch.int64), positions=torch.tensor([3, 9, 17, 30]))


def attend(**kw: torch.Tensor) -> torch.Tensor:
    return reference_ops.paged_attention(**{**inputs(), **kw}, n_kv_heads=HKV, block_size=BS)


def test_a_column_of_a_wider_buffer_is_refused_and_its_contiguous_copy_is_not() -> None:
    """The draft rounds' positions are a column of [B, K+1] (drafters/device_draft.py): the kernel
    would read `pos_ptr + t`, the next row's first column, not this row's."""
    rounds = torch.tensor([[3, 4, 5], [9, 10, 11], [17, 18, 19], [30, 31, 32]])
    column = rounds[:, 0]
    assert not column.is_contiguous()
    with pytest.raises(KernelInputError, match="positions must be contiguous"):
        attend(positions=column)
    assert torch.equal(attend(positions=column.contiguous()), attend())


@pytest.mark.parametrize("name,bad,match", [
    ("q", lambda x: x.t().contiguous().t(), "q must be contiguous"),
    ("k_cache", lambda x: x.double(), "k_cache must be torch.float32"),
    ("positions", lambda x: x.int(), "positions must be torch.int64"),
    ("tables", lambda x: x.long(), "tables must be torch.int32"),
    ("row_table", lambda x: x[:2], r"row_table must be \[4\]"),
])
def test_what_the_kernel_would_misread_is_refused(name: str, bad, match: str) -> None:
    with pytest.raises(KernelInputError, match=match):
        attend(**{name: bad(inputs()[name])})


def test_rms_norm_refuses_a_strided_input() -> None:
    x = torch.randn(8, 6)
    with pytest.raises(KernelInputError, match="contiguous"):
        reference_ops.rms_norm(x[:, :4], torch.ones(4), 1e-5)


@pytest.mark.parametrize("group,head_dim,want", [(1, 64, (16, 64)), (3, 96, (16, 128)), (32, 80, (32, 128)),
                                                 (2, 8, (16, 16))])
def test_attention_blocks_are_powers_of_two_covering_the_head(group: int, head_dim: int, want) -> None:
    blocks = attention_blocks(group, head_dim)
    assert (blocks.g_pad, blocks.d_pad) == want
    assert all(n & (n - 1) == 0 for n in (blocks.g_pad, blocks.d_pad, blocks.block_n))


def head_dim(d: int) -> ModelConfig:
    return tiny_config(300).replace(hidden_size=2 * d, n_heads=2, n_kv_heads=1, head_dim=d, attn_scale=d ** -0.5,
                                    rotary_dim=d)


def test_a_head_dim_of_96_runs_and_one_past_the_kernels_limit_is_refused_by_name() -> None:
    from interlock.models.device_llama import DeviceLlama, step_inputs

    cfg = head_dim(96).replace(max_position=64)                     # Phi-3-mini's head dim
    cpu = random_transformer(cfg, seed=1)
    cpu.build("float")
    dev = DeviceLlama.from_transformer(cpu, "cpu", torch.float32, gemm_rows=8)
    kv = PagedKVCache(dev.config, num_blocks=8, block_size=4)
    kv.add_sequence(0)
    start = kv.reserve(0, 5)
    logits = dev(step_inputs([SeqChunk(0, (5, 6, 7, 8, 9), start, ())], kv, max_blocks=4, pad_slot=28,
                             device="cpu"), kv)
    assert logits.shape == (5, 300) and bool(torch.isfinite(logits).all())
    with pytest.raises(UnsupportedModelError, match="head_dim <= 256"):
        DeviceLlama.random(head_dim(320), "cpu", dtype=torch.float32)
