"""KVActor: owns the paged KV allocator (block tables, free list) and the admission promises.

A request is admitted only with a promise of every block it can ever hold (`promise`); the
promise is returned when it is freed (`free`). The count of promised blocks lives only here,
beside the pool it promises from.

With prefix caching, a request's sequences start at admission on the cached blocks of their prompts
(`promise`'s seqs), and `rewind`'s commits hand the pool each step's committed tokens so the blocks
they fill become shareable. A promise still counts every block the request can hold, the shared ones
included: a shared block outlives whichever holder frees first, so discounting it could over-promise.
Cached blocks that no sequence holds count as free (eviction reclaims them), so the pool keeps every
promise: blocks in use <= blocks held (summed per request) <= blocks promised.

Calls, not messages: the Scheduler calls `promise`, `reserve`, `rewind` and `free` on the event
loop, between steps (its only caller; docs/architecture.md, "Messages"). The pool decides (a
promise it cannot keep is refused), but an answer the Scheduler needs before it can plan gains
nothing from an inbox: the same loop runs both, and a message would cost a task switch per step.
What reaches the actor from another task (the Engine's usage query) stays a message.

The K/V *storage* tensors are written only by the model forward (VerifierActor), which gets a
reference to them at wiring time; positions and blocks are granted only here.
"""
from __future__ import annotations

from collections.abc import Mapping

from interlock.actors.framework.base import Actor, Handler
from interlock.models.kv_cache import PagedKVCache
from interlock.protocol.messages import BlockTables, KVUsage
from interlock.protocol.types import SeqId, TokenId
from interlock.logs import get_logger

log = get_logger(__name__)

SeqTokens = tuple[tuple[SeqId, tuple[TokenId, ...]], ...]      # (sequence, tokens), in order


class KVActor(Actor[object]):
    def __init__(self, kv: PagedKVCache) -> None:
        self.kv = kv
        self.promised = 0
        super().__init__("kv")

    def handlers(self) -> Mapping[type, Handler]:
        return {KVUsage: self.on_usage}

    # --- the Scheduler's calls (on the loop, between steps) ----------------------------------------

    def promise(self, blocks: int, seqs: SeqTokens) -> tuple[int, ...] | None:
        """Promise `blocks` blocks if the pool can still keep every promise, then start each (seq,
        prompt) on its cached prefix; their cached positions (0 without prefix caching), in order,
        or None when refused. A refused promise can change only after a `free`."""
        if self.promised + blocks > self.kv.num_blocks:
            return None
        self.promised += blocks
        return tuple(self.kv.add_sequence(seq, prompt) for seq, prompt in seqs)

    def reserve(self, items: tuple[tuple[SeqId, int], ...]) -> BlockTables:
        """Grow each (seq, n) by n positions (new seqs are added); the step's block tables. All or
        nothing: on KVCacheExhaustedError (a broken promise: a bug) every position reserved here is
        undone before it propagates."""
        added: list[SeqId] = []                 # freed on a failure, the one that failed included
        grown: list[tuple[SeqId, int]] = []     # rewound on a failure
        try:
            for seq, n in items:
                if seq not in self.kv.sequences:
                    self.kv.add_sequence(seq)
                    added.append(seq)
                self.kv.reserve(seq, n)         # raises with nothing allocated for seq
                grown.append((seq, n))
        except Exception:
            for seq, n in reversed(grown):
                if seq not in added:
                    self.kv.rewind(seq, n)
            for seq in added:
                self.kv.free(seq)
            raise
        seqs = dict.fromkeys(seq for seq, _ in items)
        return BlockTables(self.kv.block_size, tuple((s, self.kv.block_table(s)) for s in seqs))

    def rewind(self, items: tuple[tuple[SeqId, int], ...], commits: SeqTokens = ()) -> None:
        """A step's outcome: drop each (seq, n)'s last n positions, then take each (seq, tokens) of
        `commits` as seq's next committed tokens, their K/V written (with prefix caching the blocks
        they fill become shareable by later requests)."""
        for seq, n in items:
            if n:
                self.kv.rewind(seq, n)
        for seq, tokens in commits:
            self.kv.commit(seq, tokens)

    def free(self, seqs: tuple[SeqId, ...], blocks: int) -> None:
        """Free the sequences and return the request's admission promise of `blocks` blocks."""
        for seq in seqs:
            self.kv.free(seq)
        self.promised -= blocks

    # --- messages ----------------------------------------------------------------------------------

    async def on_usage(self, msg: KVUsage) -> None:
        self.kv.check()
        msg.reply.set_result((self.kv.num_free_blocks, self.kv.num_blocks, len(self.kv.sequences),
                              self.kv.num_cached_blocks))
