"""A paged KV cache: a pool of fixed-size blocks and one block table per sequence.

Terms: L = layers, N = blocks in the pool, S = block size (tokens per block), Hkv = KV heads,
D = head dim. Storage is flat by *slot* (slot = block * S + offset) so that writing and gathering
are one index_copy_ / index_select per layer, whatever the batch looks like.

Only the owner of the cache (the KVActor in the runtime, the test in a test) calls these methods;
every operation is O(blocks touched) and either completes or changes nothing.

With `prefix_caching=True` the pool is content-addressed (models/prefix_cache.py): `commit` hands it
each sequence's committed tokens, full blocks become shareable, and `add_sequence(seq, prompt)` starts
a sequence on the cached blocks of its prompt's longest cached prefix. Shared blocks are full and
committed; a sequence only ever writes at positions >= its length, so it never writes into them.

`prefix_granularity` (positions, a multiple of the block size) rounds every hit down to a multiple
of itself. Where prompt chunks take the dense path the engine sets it to the prefill chunk: a
prompt then resumes at a chunk boundary and computes exactly the chunks a cold prefill computes,
bit for bit. A hit inside a chunk would compute that chunk's tail as a shorter GEMM, and the bf16
GEMM picks its kernel (so its rounding) by the number of rows: logits would move by a few
hundredths on SmolLM2. For the same reason such a cache shares only what whole prefill chunks of
a prompt computed (`share_outputs=False`): a later prompt that repeats an output (multi-turn) would
otherwise hit K/V that decode rows wrote, where a cold prefill computes them in a chunk. Where prompt
chunks take the batch-invariant rows path (`Transformer.rows_prefill`) every token's K/V are the
same whichever step computed them: a hit is any whole number of blocks, outputs included.
"""
from __future__ import annotations

import torch

from collections.abc import Sequence

from interlock.models.config import ModelConfig
from interlock.models.prefix_cache import BlockHash, BlockPool, chain_hashes
from interlock.protocol.errors import KVCacheExhaustedError
from interlock.protocol.types import BlockId, SeqId, TokenId

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def slots_of(table: tuple[BlockId, ...] | list[BlockId], block_size: int, start: int, n: int) -> list[int]:
    """Flat slot index of positions [start, start + n) of a sequence with this block table."""
    return [table[p // block_size] * block_size + p % block_size for p in range(start, start + n)]


def block_bytes(config: ModelConfig, block_size: int) -> int:
    """Bytes one block takes in the pool: K and V for every layer, KV head and position."""
    itemsize = torch.empty((), dtype=_DTYPES[config.cache_dtype]).element_size()
    return 2 * config.n_layers * block_size * config.n_kv_heads * config.head_dim * itemsize


class PagedKVCache:
    """Block pool + per-sequence block tables + the K/V storage tensors."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int = 16,
                 device: torch.device | str = "cpu", *, prefix_caching: bool = False,
                 namespace: bytes = b"", prefix_granularity: int | None = None, share_outputs: bool = True,
                 spare_blocks: int = 0) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        granularity = prefix_granularity or block_size
        if granularity <= 0 or granularity % block_size:
            raise ValueError(f"prefix_granularity must be a positive multiple of the block size {block_size}, "
                             f"got {prefix_granularity}")
        self.config = config
        self.num_blocks = num_blocks
        self.block_size = block_size
        # spare blocks: storage past the pool's blocks, never granted (the device runner's padding
        # rows write their K/V to the first one: block id num_blocks)
        shape = (config.n_layers, (num_blocks + spare_blocks) * block_size, config.n_kv_heads, config.head_dim)
        self.k = torch.zeros(shape, dtype=_DTYPES[config.cache_dtype], device=device)   # [L, N*S, Hkv, D]
        self.v = torch.zeros_like(self.k)
        self.prefix_caching = prefix_caching
        self.namespace = namespace              # the model (and adapter) the cached K/V belong to
        self._hit_blocks = granularity // block_size    # a hit is a multiple of this many blocks
        self._share_outputs = share_outputs
        self._shareable: dict[SeqId, int] = {}             # without share_outputs: its blocks that may be
        self._pool = BlockPool(num_blocks)
        self._tables: dict[SeqId, list[BlockId]] = {}
        self._lengths: dict[SeqId, int] = {}
        self._tokens: dict[SeqId, list[TokenId]] = {}      # committed tokens (prefix caching only)
        self._hashes: dict[SeqId, list[BlockHash]] = {}    # hashes of its full committed blocks

    # --- queries -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks a reservation can still take: free ones and cached ones no sequence holds."""
        return self._pool.num_free

    @property
    def num_cached_blocks(self) -> int:
        """Blocks no sequence holds that keep their content for a later prefix hit."""
        return self._pool.num_cached

    def refcount(self, block: BlockId) -> int:
        return self._pool.refcount(block)

    def check(self) -> None:
        """Invariants (tests, resource checks): the pool's states, and each block held as often as
        the block tables name it."""
        self._pool.check()
        held: dict[BlockId, int] = {}
        for table in self._tables.values():
            for b in table:
                held[b] = held.get(b, 0) + 1
        assert all(self._pool.refcount(b) == held.get(b, 0) for b in range(self._pool.num_blocks)), "refcounts disagree"

    @property
    def sequences(self) -> frozenset[SeqId]:
        return frozenset(self._tables)

    def length(self, seq: SeqId) -> int:
        return self._lengths[seq]

    def block_table(self, seq: SeqId) -> tuple[BlockId, ...]:
        return tuple(self._tables[seq])

    def blocks_needed(self, seq: SeqId | None, n: int) -> int:
        """Blocks that reserving n more positions for `seq` (None: a new sequence) would take."""
        length = 0 if seq is None else self._lengths[seq]
        have = 0 if seq is None else len(self._tables[seq])
        return max(0, -(-(length + n) // self.block_size) - have)

    def slots(self, seq: SeqId, start: int, n: int) -> list[int]:
        """Flat slot index of positions [start, start + n) of `seq` (they must be reserved)."""
        if start < 0 or start + n > self._lengths[seq]:
            raise IndexError(f"positions [{start}, {start + n}) outside sequence {seq} of length {self._lengths[seq]}")
        return slots_of(self._tables[seq], self.block_size, start, n)

    # --- changes -----------------------------------------------------------------------------

    def cached_prefix(self, prompt: Sequence[TokenId]) -> int:
        """Positions of `prompt` that `add_sequence` would find cached (takes nothing)."""
        if not self.prefix_caching:
            return 0
        return len(self._hit_hashes(prompt)) * self.block_size

    def add_sequence(self, seq: SeqId, prompt: Sequence[TokenId] = ()) -> int:
        """Start `seq`; with prefix caching, on the cached blocks of `prompt`'s longest cached prefix.

        Returns how many positions are already computed (a multiple of the block size, and never the
        prompt's last token, which the first sampling step feeds).
        """
        if seq in self._tables:
            raise ValueError(f"sequence {seq} already exists")
        blocks = self._pool.lookup(self._hit_hashes(prompt)) if self.prefix_caching else []
        n = len(blocks) * self.block_size
        self._tables[seq] = blocks
        self._lengths[seq] = n
        if self.prefix_caching:
            self._tokens[seq] = list(prompt[:n])
            self._hashes[seq] = chain_hashes(prompt[:n], self.block_size, self.namespace)
            if not self._share_outputs:       # the whole granules of its prompt's prefill (never the last token)
                granules = max(len(prompt) - 1, 0) // (self._hit_blocks * self.block_size)
                self._shareable[seq] = granules * self._hit_blocks
        return n

    def commit(self, seq: SeqId, tokens: Sequence[TokenId]) -> None:
        """The next committed tokens of `seq` (their K/V are written): blocks they fill become shareable."""
        if not self.prefix_caching:
            return
        done = self._tokens[seq]
        if len(done) + len(tokens) > self._lengths[seq]:
            raise ValueError(f"sequence {seq}: committing past its {self._lengths[seq]} reserved positions")
        done.extend(tokens)
        hashes, s = self._hashes[seq], self.block_size
        full = len(done) // s
        if full > len(hashes):
            parent = hashes[-1] if hashes else None
            new = chain_hashes(done[len(hashes) * s: full * s], s, self.namespace, parent)
            limit = self._shareable.get(seq)
            for i, h in enumerate(new, start=len(hashes)):
                if limit is None or i < limit:
                    self._pool.register(self._tables[seq][i], h)
            hashes.extend(new)

    def _hit_hashes(self, prompt: Sequence[TokenId]) -> list[BlockHash]:
        """The hashes of the prompt's cached prefix, rounded down to the prefix granularity."""
        hashes = self._prompt_hashes(prompt)
        n = self._pool.peek(hashes)
        return hashes[: n - n % self._hit_blocks]

    def _prompt_hashes(self, prompt: Sequence[TokenId]) -> list[BlockHash]:
        return chain_hashes(prompt[: len(prompt) - 1], self.block_size, self.namespace) if prompt else []

    def reserve(self, seq: SeqId, n: int) -> int:
        """Grow `seq` by n positions (allocating blocks as needed); returns the first new position.

        Raises KVCacheExhaustedError, with nothing allocated, if the pool cannot hold them.
        """
        if n < 0:
            raise ValueError(f"cannot reserve {n} positions")
        need = self.blocks_needed(seq, n)
        if need > self._pool.num_free:
            raise KVCacheExhaustedError(
                f"KV cache full: sequence {seq} needs {need} more blocks of {self.block_size} tokens, "
                f"{self._pool.num_free} free of {self.num_blocks}; lower the batch size or max_tokens, "
                "or give the engine more KV blocks (num_kv_blocks=...)")
        table = self._tables[seq]
        for _ in range(need):
            table.append(self._pool.allocate())
        start = self._lengths[seq]
        self._lengths[seq] = start + n
        return start

    def rewind(self, seq: SeqId, n: int) -> None:
        """Drop the last n positions of `seq`; blocks left empty go back to the pool."""
        length = self._lengths[seq]
        if not 0 <= n <= length:
            raise ValueError(f"cannot rewind {n} positions of sequence {seq} with length {length}")
        if self.prefix_caching and length - n < len(self._tokens[seq]):
            raise ValueError(f"cannot rewind sequence {seq} below its {len(self._tokens[seq])} committed positions")
        self._lengths[seq] = length - n
        keep = -(-(length - n) // self.block_size)
        table = self._tables[seq]
        while len(table) > keep:
            self._pool.release(table.pop())

    def release(self) -> None:
        """Drop the storage now (the engine calls this on close): a closed engine's pool may sit in
        a reference cycle until the garbage collector runs, and pools are the largest thing we own."""
        self.k = self.v = torch.empty(0)
        self._pool = BlockPool(0)
        self._tables.clear()
        self._lengths.clear()
        self._tokens.clear()
        self._hashes.clear()

    def free(self, seq: SeqId) -> None:
        """Return every block of `seq` to the pool and forget it. Freeing an unknown seq is a no-op.

        Last block first: cached blocks are evicted oldest first, and a prefix's tail is the part
        least likely to be shared again.
        """
        table = self._tables.pop(seq, None)
        if table is not None:
            for block in reversed(table):
                self._pool.release(block)
            del self._lengths[seq]
            self._tokens.pop(seq, None)
            self._hashes.pop(seq, None)
            self._shareable.pop(seq, None)
