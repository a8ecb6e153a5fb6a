"""Prefix caching: chain hashes, the block pool's states, and the KV cache under any mix of
prefill, speculative steps (write drafts, commit the accepted, rewind the rest), frees and eviction.
The model is simulated by writing each position's token id into K, so a shared block that anyone
overwrote, or a block evicted while in use, shows up as a sequence whose K is not its own tokens."""
from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from interlock.models.config import tiny_config
from interlock.models.kv_cache import PagedKVCache
from interlock.models.prefix_cache import BlockPool, chain_hashes
from interlock.protocol.errors import KVCacheExhaustedError

S = 4


def test_chain_hashes_name_whole_prefixes():
    a = chain_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], S)
    assert len(a) == 2                                   # the partial third block has none
    assert chain_hashes([1, 2, 3, 4, 5, 6, 7, 8], S) == a
    assert chain_hashes([0, 2, 3, 4, 5, 6, 7, 8], S)[1] != a[1]   # same block, other prefix
    assert chain_hashes([1, 2, 3, 4], S, b"model-a") != chain_hashes([1, 2, 3, 4], S, b"model-b")


def test_pool_caches_released_hashed_blocks_and_evicts_oldest_first():
    pool = BlockPool(3)
    a, b, c = pool.allocate(), pool.allocate(), pool.allocate()
    with pytest.raises(KVCacheExhaustedError):
        pool.allocate()
    pool.register(a, b"A")
    pool.register(b, b"B")
    pool.release(b)
    pool.release(a)
    pool.release(c)                                      # unhashed: plain free
    assert pool.num_free == 3 and pool.num_cached == 2
    assert pool.allocate() == c                          # free blocks before cached ones
    assert pool.lookup([b"A", b"X"]) == [a] and pool.refcount(a) == 1
    assert pool.allocate() == b                          # evicts the only cached block
    assert pool.peek([b"B"]) == 0 and pool.peek([b"A"]) == 1
    pool.register(b, b"A")                               # same content as a: b stays private
    pool.release(b)
    assert pool.num_cached == 0
    pool.check()
    with pytest.raises(ValueError):
        pool.release(b)


class PrefixCacheMachine(RuleBasedStateMachine):
    """Random prompts over a 3-token alphabet (so prefixes are shared) on a pool of 12 blocks."""

    @initialize()
    def setup(self) -> None:
        self.kv = PagedKVCache(tiny_config(32), num_blocks=12, block_size=S, prefix_caching=True)
        self.live: dict[int, list[int]] = {}            # seq -> committed tokens
        self.next_seq = 0

    def _write(self, seq: int, start: int, tokens: list[int]) -> None:
        if not tokens:
            return
        slots = torch.tensor(self.kv.slots(seq, start, len(tokens)))
        self.kv.k[0, slots, 0, 0] = torch.tensor(tokens, dtype=self.kv.k.dtype)

    @rule(prompt=st.lists(st.integers(0, 2), min_size=2, max_size=20))
    def add(self, prompt: list[int]) -> None:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        expected = self.kv.cached_prefix(prompt)
        n = self.kv.add_sequence(seq, prompt)
        assert n == expected and n % S == 0 and n <= len(prompt) - 1
        try:
            start = self.kv.reserve(seq, len(prompt) - 1 - n)
        except KVCacheExhaustedError:
            self.kv.free(seq)
            return
        self._write(seq, start, prompt[n:-1])
        self.kv.commit(seq, prompt[n:-1])
        self.live[seq] = list(prompt[:-1])

    @precondition(lambda self: self.live)
    @rule(data=st.data(), drafts=st.lists(st.integers(0, 2), max_size=3))
    def step(self, data: st.DataObject, drafts: list[int]) -> None:
        seq = data.draw(st.sampled_from(sorted(self.live)))
        tokens = [data.draw(st.integers(0, 2))] + drafts
        try:
            start = self.kv.reserve(seq, len(tokens))
        except KVCacheExhaustedError:
            return
        self._write(seq, start, tokens)
        kept = 1 + data.draw(st.integers(0, len(drafts)))
        self.kv.commit(seq, tokens[:kept])
        self.kv.rewind(seq, len(tokens) - kept)
        self.live[seq].extend(tokens[:kept])

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.live)))
        self.kv.free(seq)
        del self.live[seq]

    @invariant()
    def blocks_are_consistent(self) -> None:
        pool = self.kv._pool
        pool.check()
        held: dict[int, int] = {}
        for seq in self.live:
            for b in self.kv.block_table(seq):
                held[b] = held.get(b, 0) + 1
        assert all(pool.refcount(b) == held.get(b, 0) for b in range(self.kv.num_blocks))
        assert self.kv.num_free_blocks == self.kv.num_blocks - len(held)

    @invariant()
    def every_sequence_reads_its_own_tokens(self) -> None:
        for seq, tokens in self.live.items():
            assert self.kv.length(seq) == len(tokens)
            if tokens:
                got = self.kv.k[0, torch.tensor(self.kv.slots(seq, 0, len(tokens))), 0, 0]
                assert got.tolist() == [float(t) for t in tokens]


PrefixCacheMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestPrefixCache = PrefixCacheMachine.TestCase


def test_a_repeated_prompt_skips_its_cached_blocks_and_they_survive_the_first_request():
    kv = PagedKVCache(tiny_config(32), num_blocks=8, block_size=S, prefix_caching=True)
    prompt = list(range(11))                             # 10 positions prefilled: 2 full blocks
    assert kv.add_sequence(0, prompt) == 0
    kv.reserve(0, 10)
    kv.commit(0, prompt[:10])
    kv.free(0)
    assert kv.num_cached_blocks == 2 and kv.num_free_blocks == 8
    assert kv.add_sequence(1, prompt) == 8
    assert kv.add_sequence(2, prompt[:9] + [99, 98]) == 8
    assert kv.refcount(kv.block_table(1)[0]) == 2
    with pytest.raises(ValueError):
        kv.rewind(1, 1)                                  # below committed: never into a shared block
    off = PagedKVCache(tiny_config(32), num_blocks=8, block_size=S)
    assert off.add_sequence(0, prompt) == 0 and off.cached_prefix(prompt) == 0
