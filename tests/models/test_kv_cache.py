from __future__ import annotations

import pytest

from interlock.models.config import tiny_config
from interlock.models.kv_cache import PagedKVCache
from interlock.protocol.errors import KVCacheExhaustedError


def make(num_blocks: int = 8, block_size: int = 4) -> PagedKVCache:
    return PagedKVCache(tiny_config(64), num_blocks=num_blocks, block_size=block_size)


def test_reserve_allocates_blocks_on_demand_and_returns_start() -> None:
    kv = make()
    kv.add_sequence(7)
    assert kv.reserve(7, 3) == 0
    assert len(kv.block_table(7)) == 1
    assert kv.reserve(7, 2) == 3
    assert len(kv.block_table(7)) == 2 and kv.length(7) == 5
    assert kv.num_free_blocks == 6


def test_slots_follow_the_block_table() -> None:
    kv = make(block_size=4)
    kv.add_sequence(0)
    kv.add_sequence(1)
    kv.reserve(0, 2)
    kv.reserve(1, 4)
    kv.reserve(0, 4)                    # seq 0 now spans two non-adjacent blocks
    table = kv.block_table(0)
    assert kv.slots(0, 0, 6) == [table[0] * 4 + i for i in range(4)] + [table[1] * 4 + i for i in range(2)]
    with pytest.raises(IndexError):
        kv.slots(0, 4, 3)


def test_rewind_returns_emptied_blocks() -> None:
    kv = make(block_size=4)
    kv.add_sequence(0)
    kv.reserve(0, 9)                     # 3 blocks
    kv.rewind(0, 4)                      # length 5: still 2 blocks
    assert kv.length(0) == 5 and len(kv.block_table(0)) == 2
    kv.rewind(0, 5)
    assert kv.length(0) == 0 and kv.block_table(0) == () and kv.num_free_blocks == 8
    with pytest.raises(ValueError):
        kv.rewind(0, 1)


def test_exhaustion_is_typed_and_allocates_nothing() -> None:
    kv = make(num_blocks=3, block_size=4)
    kv.add_sequence(0)
    kv.reserve(0, 8)
    kv.add_sequence(1)
    with pytest.raises(KVCacheExhaustedError, match="KV cache full"):
        kv.reserve(1, 5)                 # needs 2 blocks, 1 free
    assert kv.num_free_blocks == 1 and kv.length(1) == 0 and kv.block_table(1) == ()


def test_free_returns_everything_and_is_idempotent() -> None:
    kv = make()
    for seq in range(3):
        kv.add_sequence(seq)
        kv.reserve(seq, 5)
    for seq in range(3):
        kv.free(seq)
        kv.free(seq)
    assert kv.num_free_blocks == kv.num_blocks and kv.sequences == frozenset()


def test_prefix_hits_round_down_to_the_granularity() -> None:
    """Hits count whole granules (the engine's prefill chunk), and the blocks past the last whole
    granule stay untaken: the new sequence computes them itself."""
    kv = PagedKVCache(tiny_config(64), num_blocks=16, block_size=4, prefix_caching=True, prefix_granularity=8)
    prompt = list(range(1, 15))                          # 14 tokens: 3 full blocks before the last token
    kv.add_sequence(0, prompt)
    kv.reserve(0, 13)
    kv.commit(0, prompt[:13])
    assert kv.cached_prefix(prompt) == 8                 # 12 cached positions, rounded down to 8
    assert kv.add_sequence(1, prompt) == 8
    third = kv.block_table(0)[2]
    assert kv.refcount(third) == 1 and all(kv.refcount(b) == 2 for b in kv.block_table(1))
    with pytest.raises(ValueError):
        PagedKVCache(tiny_config(64), num_blocks=4, block_size=4, prefix_granularity=6)


@pytest.mark.parametrize("share_outputs", [True, False])
def test_without_share_outputs_only_whole_prefill_granules_are_shared(share_outputs: bool) -> None:
    """A sequence's output (and its prompt's last, partial granule) is shareable only where every
    step computes K/V the way a prefill chunk would (share_outputs: the rows path)."""
    kv = PagedKVCache(tiny_config(64), num_blocks=16, block_size=4, prefix_caching=True, prefix_granularity=8,
                      share_outputs=share_outputs)
    prompt, output = list(range(1, 12)), list(range(50, 62))       # prefill computes 10: one whole granule
    kv.add_sequence(0, prompt)
    kv.reserve(0, len(prompt) + len(output))
    kv.commit(0, prompt + output)
    follow_up = prompt + output + [7, 8]
    assert kv.cached_prefix(follow_up) == (16 if share_outputs else 8)
