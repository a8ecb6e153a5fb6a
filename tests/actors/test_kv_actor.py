"""The KVActor's calls (the Scheduler's, on the loop): promises kept, reservations all or nothing."""
from __future__ import annotations

import pytest

from interlock.actors.kv_actor import KVActor
from interlock.models.config import tiny_config
from interlock.models.kv_cache import PagedKVCache
from interlock.protocol.errors import KVCacheExhaustedError

BLOCK = 4


def actor(blocks: int) -> KVActor:
    return KVActor(PagedKVCache(tiny_config(32), num_blocks=blocks, block_size=BLOCK))


def test_a_promise_the_pool_cannot_keep_is_refused_until_a_free() -> None:
    kv = actor(4)
    assert kv.promise(3, ((0, ()),)) == (0,)          # no prefix caching: nothing cached
    assert kv.promise(2, ((1, ()),)) is None          # 3 + 2 > 4: refused, and nothing started
    assert 1 not in kv.kv.sequences
    kv.free((0,), 3)
    assert kv.promise(2, ((1, ()),)) == (0,) and kv.promised == 2


def test_a_reservation_that_does_not_fit_undoes_every_position_it_took() -> None:
    kv = actor(4)
    kv.reserve(((0, 2 * BLOCK),))                     # seq 0 holds 2 blocks
    with pytest.raises(KVCacheExhaustedError):
        kv.reserve(((0, BLOCK), (1, 3 * BLOCK)))      # seq 0 gets a third, seq 1 cannot get 3
    assert kv.kv.block_table(0) == kv.reserve(((0, 0),)).block_table(0) and len(kv.kv.block_table(0)) == 2
    assert 1 not in kv.kv.sequences and kv.kv.num_free_blocks == 2


def test_a_rewind_returns_the_blocks_left_empty() -> None:
    kv = actor(4)
    tables = kv.reserve(((0, BLOCK + 1),))
    assert len(tables.block_table(0)) == 2
    kv.rewind(((0, 1),))
    assert len(kv.kv.block_table(0)) == 1 and kv.kv.num_free_blocks == 3
