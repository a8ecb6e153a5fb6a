"""The KV pool (models/kv_cache.py's PagedKVCache over models/prefix_cache.py's BlockPool) against a
slow obvious model of what it must do, under any mix of admissions, speculative steps (reserve the
drafts, commit the accepted, rewind the rest), frees, failed reservations and eviction.

The model names blocks by content, never by id: a sequence's block is either private or the
shared block of one prefix (the tokens up to its end); a shared block nobody holds stays cached
until an allocation finds no plain free block and evicts the least recently released one. Each
sequence is admitted under a promise of every block it can ever hold, as the KVActor promises
(summed promises <= the pool): a reservation within its promise must never fail, shared and
cached blocks notwithstanding. K is written with each position's token, so a shared block that
anyone overwrote, or an evicted block still in use, shows up as a sequence that reads wrong K."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from interlock.models.config import tiny_config
from interlock.models.kv_cache import PagedKVCache
from interlock.protocol.errors import KVCacheExhaustedError

S, N = 4, 12        # block size, blocks in the pool

Key = tuple[int, ...]   # a shared block: the whole prefix it ends (its chain hash names the same)

# Prompts that share prefixes often: a cut of one of three stems, then a short tail.
STEMS = ([0] * 12, [1, 2] * 6, [2, 1, 0] * 4)
PROMPTS = st.builds(lambda stem, cut, tail: (stem[:cut] + tail + [0, 0])[: max(2, cut + len(tail))],
                    st.sampled_from(STEMS), st.integers(0, 12), st.lists(st.integers(0, 2), max_size=6))


@dataclass
class Seq:
    budget: int                                          # positions it may ever hold (its promise)
    tokens: list[int] = field(default_factory=list)      # each reserved position's token (its K)
    committed: int = 0                                   # leading positions committed
    blocks: list[Key | None] = field(default_factory=list)   # None: a private block


class SlowPool:
    """The pool by content (module docstring): counts, sharing, hits and eviction order."""

    def __init__(self, caching: bool, hit_blocks: int) -> None:
        self.caching, self.hit_blocks = caching, hit_blocks
        self.seqs: dict[int, Seq] = {}
        self.holders: dict[Key, int] = {}                # shared blocks some table names -> how many
        self.cached: list[Key] = []                      # shared blocks nobody holds, oldest release first

    def in_use(self) -> int:
        return len(self.holders) + sum(b is None for s in self.seqs.values() for b in s.blocks)

    def num_free(self) -> int:
        return N - self.in_use()

    def resident(self, key: Key) -> bool:
        return key in self.holders or key in self.cached

    def hit(self, prompt: list[int]) -> int:
        """Blocks of `prompt`'s longest resident prefix (never its last token), whole granules only."""
        if not self.caching:
            return 0
        k = 0
        while (k + 1) * S <= len(prompt) - 1 and self.resident(tuple(prompt[: (k + 1) * S])):
            k += 1
        return k - k % self.hit_blocks

    def add(self, seq: int, prompt: list[int], budget: int) -> int:
        k = self.hit(prompt)
        keys = [tuple(prompt[: (i + 1) * S]) for i in range(k)]
        for key in keys:
            self._hold(key)
        self.seqs[seq] = Seq(budget, list(prompt[: k * S]), k * S, list(keys))
        return k * S

    def reserve(self, seq: int, tokens: list[int]) -> bool:
        s = self.seqs[seq]
        need = -(-(len(s.tokens) + len(tokens)) // S) - len(s.blocks)
        if need > self.num_free():
            return False
        plain_free = self.num_free() - len(self.cached)
        del self.cached[: max(0, need - plain_free)]     # evicted: their content is gone
        s.blocks.extend([None] * need)
        s.tokens.extend(tokens)
        return True

    def commit(self, seq: int, n: int) -> None:
        s = self.seqs[seq]
        before, s.committed = s.committed, s.committed + n
        if not self.caching:
            return
        for i in range(before // S, s.committed // S):   # blocks this commit filled
            key = tuple(s.tokens[: (i + 1) * S])
            if s.blocks[i] is None and not self.resident(key):   # else another block holds it: stays private
                s.blocks[i] = key
                self.holders[key] = 1

    def rewind(self, seq: int, n: int) -> None:
        s = self.seqs[seq]
        del s.tokens[len(s.tokens) - n:]
        while len(s.blocks) > -(-len(s.tokens) // S):
            self._release(s.blocks.pop())

    def free(self, seq: int) -> None:
        for b in reversed(self.seqs.pop(seq).blocks):   # last block first: a prefix's tail is evicted first
            self._release(b)

    def _hold(self, key: Key) -> None:
        if key in self.cached:
            self.cached.remove(key)
        self.holders[key] = self.holders.get(key, 0) + 1

    def _release(self, key: Key | None) -> None:
        if key is None:
            return
        self.holders[key] -= 1
        if not self.holders[key]:
            del self.holders[key]
            self.cached.append(key)


class PoolMachine(RuleBasedStateMachine):
    """Prompts over a 3-token alphabet that repeat each other's prefixes, on a pool of N blocks."""

    caching, granularity = True, S

    @initialize()
    def setup(self) -> None:
        self.kv = PagedKVCache(tiny_config(32), num_blocks=N, block_size=S, prefix_caching=self.caching,
                               prefix_granularity=self.granularity)
        self.model = SlowPool(self.caching, self.granularity // S)
        self.promised = 0
        self.next_seq = 0

    def _write(self, seq: int, start: int, tokens: list[int]) -> None:
        if tokens:
            slots = torch.tensor(self.kv.slots(seq, start, len(tokens)))
            self.kv.k[0, slots, 0, 0] = torch.tensor(tokens, dtype=self.kv.k.dtype)

    def _reserve(self, seq: int, tokens: list[int]) -> None:
        """Within the sequence's promise: the pool must grant it, where the model says."""
        assert self.model.reserve(seq, tokens)
        start = self.kv.reserve(seq, len(tokens))
        self._write(seq, start, tokens)

    @rule(prompt=PROMPTS, new=st.integers(0, 12))
    def admit(self, prompt: list[int], new: int) -> None:
        budget = len(prompt) - 1 + new
        blocks = -(-budget // S)
        if self.promised + blocks > N:                   # the KVActor refuses: nothing is started
            return
        self.promised += blocks
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        assert self.kv.cached_prefix(prompt) == self.model.hit(prompt) * S
        n = self.kv.add_sequence(seq, prompt)
        assert n == self.model.add(seq, prompt, budget)
        self._reserve(seq, prompt[n:-1])                 # the prompt's prefill
        self.kv.commit(seq, prompt[n:-1])
        self.model.commit(seq, len(prompt) - 1 - n)

    @precondition(lambda self: self.model.seqs)
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.model.seqs)))
        s = self.model.seqs[seq]
        room = s.budget - len(s.tokens)
        if room == 0:
            return
        tokens = data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=min(room, 4)))   # token + drafts
        self._reserve(seq, tokens)
        kept = data.draw(st.integers(1, len(tokens)))
        self.kv.commit(seq, tokens[:kept])
        self.model.commit(seq, kept)
        self.kv.rewind(seq, len(tokens) - kept)
        self.model.rewind(seq, len(tokens) - kept)

    @precondition(lambda self: self.model.seqs)
    @rule(data=st.data(), extra=st.integers(1, 3 * S))
    def overdraw(self, data: st.DataObject, extra: int) -> None:
        """A reservation past every free block fails typed and changes nothing (all or nothing)."""
        seq = data.draw(st.sampled_from(sorted(self.model.seqs)))
        before = self._snapshot()
        with pytest.raises(KVCacheExhaustedError):
            self.kv.reserve(seq, self.kv.num_free_blocks * S + extra + (-self.kv.length(seq)) % S)
        assert self._snapshot() == before

    @precondition(lambda self: self.model.seqs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.model.seqs)))
        self.promised -= -(-self.model.seqs[seq].budget // S)
        self.kv.free(seq)
        self.model.free(seq)

    def _snapshot(self) -> tuple:
        seqs = sorted(self.kv.sequences)
        return (self.kv.num_free_blocks, self.kv.num_cached_blocks, [self.kv.length(s) for s in seqs],
                [self.kv.block_table(s) for s in seqs], [self.kv.refcount(b) for b in range(N)])

    @invariant()
    def counts_are_the_models(self) -> None:
        self.kv.check()
        assert self.kv.sequences == frozenset(self.model.seqs)
        assert self.kv.num_free_blocks == self.model.num_free()
        assert self.kv.num_cached_blocks == len(self.model.cached)

    @invariant()
    def blocks_are_shared_exactly_where_the_model_shares_them(self) -> None:
        """Two table entries name one block iff the model names both by the same prefix; a block
        is held as often as the tables name it."""
        entries = [(b, s.blocks[i]) for seq, s in self.model.seqs.items()
                   for i, b in enumerate(self.kv.block_table(seq))]
        for a, (block_a, key_a) in enumerate(entries):
            for block_b, key_b in entries[a + 1:]:
                assert (block_a == block_b) == (key_a is not None and key_a == key_b)

    @invariant()
    def every_sequence_reads_its_own_tokens(self) -> None:
        for seq, s in self.model.seqs.items():
            assert self.kv.length(seq) == len(s.tokens)
            if s.tokens:
                got = self.kv.k[0, torch.tensor(self.kv.slots(seq, 0, len(s.tokens))), 0, 0]
                assert got.tolist() == [float(t) for t in s.tokens]


class CoarsePoolMachine(PoolMachine):
    """Hits in whole granules of 2 blocks (the dense prefill path's chunk)."""

    caching, granularity = True, 2 * S


class PlainPoolMachine(PoolMachine):
    """Without prefix caching: every block private, nothing cached, every hit 0."""

    caching, granularity = False, S


_SETTINGS = settings(max_examples=150, stateful_step_count=40, deadline=None)
PoolMachine.TestCase.settings = CoarsePoolMachine.TestCase.settings = PlainPoolMachine.TestCase.settings = _SETTINGS
TestPool = PoolMachine.TestCase
TestCoarsePool = CoarsePoolMachine.TestCase
TestPlainPool = PlainPoolMachine.TestCase


def test_eviction_takes_the_least_recently_released_prefix_first() -> None:
    kv = PagedKVCache(tiny_config(32), num_blocks=4, block_size=S, prefix_caching=True)
    a, b = [1] * (2 * S + 1), [2] * (2 * S + 1)          # two blocks each before the last token
    for seq, prompt in ((0, a), (1, b)):
        kv.add_sequence(seq, prompt)
        kv.reserve(seq, 2 * S)
        kv.commit(seq, prompt[: 2 * S])
    kv.free(0)
    kv.free(1)                                           # b released last: a goes first
    assert kv.num_cached_blocks == 4 and kv.num_free_blocks == 4
    kv.add_sequence(2)
    kv.reserve(2, S)                                     # no plain free block: evicts a's last block
    assert kv.cached_prefix(a) == S and kv.cached_prefix(b) == 2 * S
    kv.reserve(2, S)
    assert kv.cached_prefix(a) == 0 and kv.cached_prefix(b) == 2 * S
    kv.check()
