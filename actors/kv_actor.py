"""KVActor: owns the paged KV allocator (block tables, free list) and the admission promises.

A request is admitted only with a promise of every block it can ever hold (`Promise`); the
promise is returned when it is freed (`Free.blocks`). The count of promised blocks lives only
here, beside the pool it promises from.

With prefix caching, a request's sequences start at admission on the cached blocks of their prompts
(`Promise.seqs`), and `Rewind.commits` hands the pool each step's committed tokens so the blocks they fill
become shareable. A promise still counts every block the request can hold, the shared ones
included: a shared block outlives whichever holder frees first, so discounting it could over-promise.
Cached blocks that no sequence holds count as free (eviction reclaims them), so the pool keeps every
promise: blocks in use <= blocks held (summed per request) <= blocks promised.

The K/V *storage* tensors are written only by the model forward (VerifierActor), which gets a
reference to them at wiring time; positions and blocks are granted only here.
"""
from __future__ import annotations

from collections.abc import Mapping


from interlock.actors.base import Actor, Handler
from interlock.models.kv_cache import PagedKVCache
from interlock.protocol.messages import BlockTables, Free, KVUsage, Promise, Reserve, Rewind
from interlock.logs import get_logger

log = get_logger(__name__)


class KVActor(Actor[object]):
    def __init__(self, kv: PagedKVCache) -> None:
        self.kv = kv
        self.promised = 0
        super().__init__("kv")

    def handlers(self) -> Mapping[type, Handler]:
        return {Reserve: self.on_reserve, Rewind: self.on_rewind, Free: self.on_free, KVUsage: self.on_usage,
                Promise: self.on_promise}

    async def on_reserve(self, msg: Reserve) -> None:
        """All or nothing: on KVCacheExhaustedError every position reserved by this message is undone."""
        done: list[tuple[int, int, bool]] = []
        try:
            for seq, n in msg.items:
                added = seq not in self.kv.sequences
                if added:
                    self.kv.add_sequence(seq)
                self.kv.reserve(seq, n)
                done.append((seq, n, added))
        except Exception as exc:
            for seq, n, added in reversed(done):
                if added:
                    self.kv.free(seq)
                else:
                    self.kv.rewind(seq, n)
            msg.reply.set_exception(exc)
            return
        seqs = dict.fromkeys(seq for seq, _ in msg.items)
        msg.reply.set_result(BlockTables(self.kv.block_size, tuple((s, self.kv.block_table(s)) for s in seqs)))

    async def on_rewind(self, msg: Rewind) -> None:
        for seq, n in msg.items:
            if n:
                self.kv.rewind(seq, n)
        for seq, tokens in msg.commits:
            self.kv.commit(seq, tokens)

    async def on_promise(self, msg: Promise) -> None:
        """Promise msg.blocks blocks if the pool can still keep every promise, then start msg.seqs
        on their cached prefixes; reply their cached positions, or None when refused."""
        if self.promised + msg.blocks > self.kv.num_blocks:
            msg.reply.set_result(None)
            return
        self.promised += msg.blocks
        msg.reply.set_result(tuple(self.kv.add_sequence(seq, prompt) for seq, prompt in msg.seqs))


    async def on_free(self, msg: Free) -> None:
        for seq in msg.seqs:
            self.kv.free(seq)
        self.promised -= msg.blocks

    async def on_usage(self, msg: KVUsage) -> None:
        self.kv.check()
        msg.reply.set_result((self.kv.num_free_blocks, self.kv.num_blocks, len(self.kv.sequences),
                              self.kv.num_cached_blocks))
