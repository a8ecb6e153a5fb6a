"""The KV block pool, with automatic prefix caching: full blocks are content-addressed and shared.

Terms: S = block size. A block is *full* once its S positions hold committed tokens. Its hash is
H(namespace, parent's hash, its S tokens) — a chain, so equal hashes mean equal whole prefixes, not
just equal blocks (H = 128-bit blake2b: a collision, which would silently share wrong K/V, is
negligible; Python's 64-bit tuple hash would not be). The namespace names the model (and adapter),
so two caches of different models never mix.

A block is in exactly one state:
  free     in no block table; content meaningless                      `_free` (a stack)
  in use   held by refcount >= 1 tables; may be hashed (then shareable) `_refs[b] > 0`
  cached   refcount 0, full and hashed: content kept for later reuse    `_lru` (oldest first)
Allocation takes a free block, else evicts the least recently released cached one (dropping its
hash): eviction only ever touches refcount-0 blocks. `num_free` (free + cached) is the one count of
what can still be allocated.

Why vLLM's hash table rather than SGLang's radix tree: our cache is already paged with per-sequence
block tables; one hash per full block fits that with O(1) work per block and nothing to keep in step
with rewinds. A radix tree shares at token granularity, which matters little at S = 16 for the
prompts that repeat here (a long shared system prompt + schema, different documents after it).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

from interlock.protocol.errors import KVCacheExhaustedError
from interlock.protocol.types import BlockId, TokenId

BlockHash = bytes


def chain_hashes(tokens: Sequence[TokenId], block_size: int, namespace: bytes = b"",
                 parent: BlockHash | None = None) -> list[BlockHash]:
    """The hash of each full block of `tokens` (a trailing partial block has none)."""
    out = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = hashlib.blake2b(digest_size=16, key=namespace[:64])
        h.update(parent or b"\0")
        h.update(b"".join(int(t).to_bytes(4, "little") for t in tokens[start:start + block_size]))
        parent = h.digest()
        out.append(parent)
    return out


class BlockPool:
    """Free, in-use and cached blocks with refcounts (see the module docstring). One owner calls it."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: list[BlockId] = list(range(num_blocks - 1, -1, -1))   # pop() gives 0, 1, 2, ...
        self._refs = [0] * num_blocks
        self._hash_of: dict[BlockId, BlockHash] = {}
        self._by_hash: dict[BlockHash, BlockId] = {}
        self._lru: OrderedDict[BlockId, None] = OrderedDict()

    @property
    def num_free(self) -> int:
        """Blocks that `allocate` can still hand out (free + cached)."""
        return len(self._free) + len(self._lru)

    @property
    def num_cached(self) -> int:
        return len(self._lru)

    def refcount(self, block: BlockId) -> int:
        return self._refs[block]

    def allocate(self) -> BlockId:
        """A block for new content (refcount 1): a free one, else the least recently cached one."""
        if self._free:
            block = self._free.pop()
        elif self._lru:
            block, _ = self._lru.popitem(last=False)
            del self._by_hash[self._hash_of.pop(block)]
        else:
            raise KVCacheExhaustedError(f"all {self.num_blocks} KV blocks are in use")
        self._refs[block] = 1
        return block

    def release(self, block: BlockId) -> None:
        """Drop one reference; at 0 a hashed block stays cached (reusable), an unhashed one is freed."""
        if self._refs[block] <= 0:
            raise ValueError(f"block {block} released more often than held")
        self._refs[block] -= 1
        if self._refs[block] == 0:
            if block in self._hash_of:
                self._lru[block] = None
            else:
                self._free.append(block)

    def lookup(self, hashes: Sequence[BlockHash]) -> list[BlockId]:
        """The blocks of the longest cached prefix of `hashes`, each with a reference taken."""
        out = []
        for h in hashes:
            block = self._by_hash.get(h)
            if block is None:
                break
            if self._refs[block] == 0:
                del self._lru[block]
            self._refs[block] += 1
            out.append(block)
        return out

    def peek(self, hashes: Sequence[BlockHash]) -> int:
        """How many leading hashes `lookup` would find (takes nothing)."""
        n = 0
        while n < len(hashes) and hashes[n] in self._by_hash:
            n += 1
        return n

    def register(self, block: BlockId, h: BlockHash) -> None:
        """`block` (in use) is full with the content `h` names: make it shareable. If another block
        already holds that content (two requests computed it at once), this one stays private."""
        if self._refs[block] <= 0:
            raise ValueError(f"block {block} is not in use")
        if block not in self._hash_of and h not in self._by_hash:
            self._hash_of[block] = h
            self._by_hash[h] = block

    def check(self) -> None:
        """Invariants (tests): every block in exactly one state; the hash maps agree."""
        free, lru = set(self._free), set(self._lru)
        used = {b for b in range(self.num_blocks) if self._refs[b] > 0}
        assert len(free) == len(self._free) and not free & lru and not free & used and not lru & used
        assert len(free) + len(lru) + len(used) == self.num_blocks
        assert all(self._by_hash[h] == b for b, h in self._hash_of.items()) and len(self._by_hash) == len(self._hash_of)
        assert lru <= set(self._hash_of) and not free & set(self._hash_of)
