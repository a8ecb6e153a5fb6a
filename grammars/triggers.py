"""Where free text switches: byte-level trigger matching over token ids, for grammars/switch/.

A trigger fires when the bytes of the free tokens end with it, however the model spelled it: a
model that writes " C" "ALL" ":" has written the trigger "CALL:" as much as one that writes the
tokenizer's own "C" "ALL" ":" (matching only the latter made a few-shot workload never switch).
The switch must still fall on a token boundary, or the grammar after it would begin mid-token, so
a token in which a trigger ends before the token does (":{" after "CALL") is refused in free text:
whenever the output's text holds a trigger, the grammar switched right after it, and the text-level
end-of-request check (grammars/validate.py) splits the output where the grammar did.

The state between tokens is the tail: the longest suffix of the free bytes that is a proper prefix
of a trigger (a few bytes). Everything else is a pure function of (tail, token), precomputed per
tail where a mask needs it: the refused tokens and the allowed row. Free rows stay free (all-ones,
skippable) wherever no token is refused, which for the usual markers is everywhere but right after
the first bytes of a trigger.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from interlock.grammars import bitmask as bm
from interlock.models.tokenizer import Tokenizer
from interlock.protocol.types import TokenId

FREE_STEP, FIRE, REFUSE = "free", "fire", "refuse"


@dataclass(frozen=True)
class TriggerScan:
    """The byte-level view of a program's triggers (shared by every matcher of the program)."""

    triggers: tuple[bytes, ...]
    vocab: tuple[bytes, ...]                                # bytes of each tokenizer id
    refused: Mapping[bytes, frozenset[TokenId]] = field(compare=False)      # tail -> refused ids
    rows: Mapping[bytes, torch.Tensor] = field(compare=False)               # tail -> allowed row
    finish: Mapping[tuple[bytes, int], tuple[TokenId, ...]] = field(compare=False)  # (tail, trigger)

    def step(self, tail: bytes, token: TokenId) -> tuple[str, bytes | int]:
        """(FREE_STEP, new tail), (FIRE, trigger index) or (REFUSE, tail) for `token` after `tail`."""
        data = tail + self.vocab[token]
        end, which = first_end(data, self.triggers)
        if end is None:
            return FREE_STEP, longest_prefix_suffix(data, self.triggers)
        if end < len(data):
            return REFUSE, tail
        return FIRE, which

    def span(self, ids: Sequence[TokenId], trigger: int) -> int:
        """How many of the last tokens `ids` hold the bytes of `trigger` (which they end with)."""
        need, k = len(self.triggers[trigger]), 0
        while need > 0 and k < len(ids):
            k += 1
            need -= len(self.vocab[ids[-k]])
        return k

    def continuation(self, tail: bytes, trigger: int) -> tuple[TokenId, ...]:
        """Tokens that, after `tail`, fire `trigger` at their last one (() when none is known)."""
        return self.finish.get((tail, trigger), ())

    def hints(self, tail: bytes) -> list[TokenId]:
        """The next token of each trigger the tail begins, else the first of every trigger."""
        begun = [i for i, t in enumerate(self.triggers) if tail and _ends_with_prefix(tail, t)]
        picks = {self.continuation(tail, i)[0] for i in begun if self.continuation(tail, i)}
        if not picks:
            picks = {self.continuation(b"", i)[0] for i in range(len(self.triggers)) if self.continuation(b"", i)}
        return sorted(picks)


def first_end(data: bytes, triggers: Sequence[bytes]) -> tuple[int | None, int]:
    """The earliest end of a trigger occurrence in data, and that trigger's index."""
    best: tuple[int | None, int] = (None, -1)
    for i, t in enumerate(triggers):
        at = data.find(t)
        if at >= 0 and (best[0] is None or at + len(t) < best[0]):
            best = (at + len(t), i)
    return best


def longest_prefix_suffix(data: bytes, triggers: Sequence[bytes]) -> bytes:
    """The longest suffix of data that is a proper prefix of some trigger."""
    longest = max(len(t) for t in triggers) - 1
    for k in range(min(len(data), longest), 0, -1):
        tail = data[-k:]
        if any(len(t) > k and t.startswith(tail) for t in triggers):
            return tail
    return b""


def _ends_with_prefix(tail: bytes, trigger: bytes) -> bool:
    return any(tail.endswith(trigger[:j]) for j in range(1, len(trigger)))


def build_scan(triggers: Sequence[bytes], trigger_ids: Sequence[tuple[TokenId, ...]], vocab: Sequence[bytes],
               tokenizer: Tokenizer, vocab_size: int) -> TriggerScan:
    """Precompute the refused ids and allowed row of every tail, and how to finish each trigger."""
    triggers, vocab = tuple(triggers), tuple(vocab)
    tails = sorted({t[:j] for t in triggers for j in range(len(t))})
    inside = {i for i, tb in enumerate(vocab) for t in triggers if 0 <= tb.find(t) < len(tb) - len(t)}
    # A trigger begun in the tail and finished inside the token: the token starts with its rest.
    firsts: dict[int, list[bytes]] = {}
    for t in triggers:
        for j in range(1, len(t)):
            firsts.setdefault(t[j], []).append(t[j:])
    across = [i for i, tb in enumerate(vocab)
              if tb and any(len(tb) > len(rest) and tb.startswith(rest) for rest in firsts.get(tb[0], ()))]
    probe = TriggerScan(triggers, vocab, {}, {}, {})        # step() only needs triggers and vocab
    refused_by: dict[bytes, frozenset[TokenId]] = {}
    rows: dict[bytes, torch.Tensor] = {}
    finish: dict[tuple[bytes, int], tuple[TokenId, ...]] = {}
    n = len(vocab)
    for tail in tails:
        refused = frozenset(inside | {i for i in across if probe.step(tail, i)[0] == REFUSE})
        row = bm.allocate_bitmask(1, vocab_size)
        bm.clear_ids_from(row, 0, n, vocab_size)
        for i in refused:
            bm.set_bit(row, 0, i, False)
        refused_by[tail], rows[tail] = refused, row[0]
        for k in range(len(triggers)):
            ids = _finish(probe, tail, k, trigger_ids[k], tokenizer)
            if ids:
                finish[(tail, k)] = ids
    return TriggerScan(triggers, vocab, refused_by, rows, finish)


def _finish(scan: TriggerScan, tail: bytes, k: int, canonical: tuple[TokenId, ...],
            tokenizer: Tokenizer) -> tuple[TokenId, ...]:
    """The tokens of the rest of trigger k after tail (the longest begun part kept), checked by
    running them: free steps, then the trigger fires on the last one."""
    trigger = scan.triggers[k]
    for j in range(len(trigger) - 1, -1, -1):
        if j and not tail.endswith(trigger[:j]):
            continue
        try:
            ids = tuple(tokenizer.encode(trigger[j:].decode())) if j else canonical
        except UnicodeDecodeError:
            continue
        if ids and _fires_at_end(scan, tail, ids, k):
            return ids
    return ()


def _fires_at_end(scan: TriggerScan, tail: bytes, ids: tuple[TokenId, ...], k: int) -> bool:
    for n, t in enumerate(ids):
        if not 0 <= t < len(scan.vocab):
            return False
        kind, out = scan.step(tail, t)
        if kind == FIRE:
            return n == len(ids) - 1 and out == k
        if kind == REFUSE:
            return False
        tail = out                                                      # type: ignore[assignment]
    return False
