"""The matcher contract, implemented once over a few backend primitives.

Every matcher (each backend's, and the switching grammars' composing one) subclasses `BaseMatcher`
and supplies the `_native_*` primitives; the rules that must hold for all of them live here, so
they cannot drift apart:

- accept is all or nothing (validate first, then consume), so a refused token never reaches a
  backend that would enter an error state (llguidance's is permanent);
- ids outside the tokenizer's vocabulary (negative, or in the model's padding) are refused here,
  before the backend sees them;
- EOS (any of the tokenizer's eos ids) is allowed exactly when the grammar accepts; accepting it
  terminates the matcher, after which every token is refused and every mask row is empty, until a
  rollback undoes the EOS.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Container, Sequence
from typing import Any

import torch

from interlock.grammars import bitmask as bm
from interlock.protocol.types import TokenId


class BaseMatcher(ABC):
    """Shared bookkeeping: accepted depth, termination, bounds checks, multi-row fills."""

    def __init__(self, *, vocab_size: int, tokenizer_vocab: int, eos_token_ids: Sequence[TokenId]) -> None:
        self._vocab_size = vocab_size                   # V: model vocabulary (mask width)
        self._tokenizer_vocab = min(tokenizer_vocab, vocab_size)  # ids >= this are padding
        self._eos = frozenset(eos_token_ids)
        self._depth = 0
        self._terminated = False

    # --- backend primitives (token ids are in range and, for consume, already validated) -------

    @abstractmethod
    def _native_validate(self, token_ids: list[TokenId]) -> int: ...

    @abstractmethod
    def _native_consume(self, token_ids: list[TokenId]) -> None: ...

    @abstractmethod
    def _native_rollback(self, n: int) -> None: ...

    @abstractmethod
    def _native_fill(self, bitmask: torch.Tensor, row: int) -> None: ...

    @abstractmethod
    def _native_forced(self) -> list[TokenId]: ...

    @abstractmethod
    def _native_accepting(self) -> bool: ...

    @abstractmethod
    def _native_reset(self) -> None: ...

    # --- the GrammarMatcher protocol ----------------------------------------------------------

    @property
    def num_accepted(self) -> int:
        return self._depth

    def validate(self, token_ids: Sequence[TokenId]) -> int:
        """Length of the longest allowed prefix of token_ids; state unchanged."""
        if self._terminated:
            return 0
        body, eos_next = self._split(token_ids)
        n = self._native_validate(body) if body else 0
        if n < len(body) or not eos_next:
            return n
        return n + 1 if self._accepting_after(body) else n    # EOS, and nothing may follow it

    def accept(self, token_ids: Sequence[TokenId]) -> bool:
        """Advance by all of token_ids, or by none and return False."""
        ids = [int(t) for t in token_ids]
        if not ids:
            return True
        if self.validate(ids) != len(ids):
            return False
        ends = ids[-1] in self._eos
        # EOS never reaches the backend: termination is ours to track, so both backends agree on
        # it and a rollback across it restores exactly the state before.
        body = ids[:-1] if ends else ids
        if body:
            self._native_consume(body)
        self._depth += len(ids)
        self._terminated = ends
        return True

    def rollback(self, n: int) -> None:
        """Undo the last n accepted tokens (a rolled-back EOS un-terminates)."""
        if n < 0 or n > self._depth:
            raise ValueError(f"cannot roll back {n} tokens: {self._depth} accepted and not rolled back")
        if n == 0:
            return
        native = n - 1 if self._terminated else n
        if native:
            self._native_rollback(native)
        self._depth -= n
        self._terminated = False

    def fill_mask(self, bitmask: Any, row: int = 0) -> bool:
        """Write the row; returns whether it is free (every id allowed: see protocol/grammar.py), which
        a plain grammar never is."""
        bm.check_bitmask(bitmask, row, self._vocab_size)
        return self._fill_row(bitmask, row, write_free=True)

    def fill_masks(self, bitmask: Any, start_row: int, drafts: Sequence[TokenId],
                   skip: Container[int] = (), free: Any = None) -> int:
        """Rows start_row+j = mask after drafts[:j]; stops at the first refused draft; state unchanged.

        skip: offsets j whose rows already hold that mask (filled while a draft model drafted).
        free: optional per-row bool buffer: each row written here is marked with its freedom, and a
        free row is then left unwritten (without the buffer it is written in full).
        """
        bm.check_bitmask(bitmask, start_row + len(drafts), self._vocab_size)
        advanced = 0
        try:
            while True:
                if advanced not in skip:
                    row = start_row + advanced
                    was_free = self._fill_row(bitmask, row, write_free=free is None)
                    if free is not None:
                        free[row] = was_free
                if advanced == len(drafts) or not self.accept([drafts[advanced]]):
                    break
                advanced += 1
        finally:
            self.rollback(advanced)
        return 1 + advanced

    def forced_tokens(self) -> list[TokenId]:
        if self._terminated:
            return []
        forced = [t for t in self._native_forced() if t not in self._eos]
        return forced[: self.validate(forced)]

    def is_accepting(self) -> bool:
        """The output so far is complete (EOS allowed now, or already accepted)."""
        return self._terminated or self._native_accepting()

    def is_terminated(self) -> bool:
        """True after EOS was accepted (and not rolled back)."""
        return self._terminated

    def reset(self) -> None:
        self._native_reset()
        self._depth = 0
        self._terminated = False

    # --- helpers -----------------------------------------------------------------------------

    def _fill_row(self, bitmask: torch.Tensor, row: int, *, write_free: bool) -> bool:
        """Write the row and say whether it is free; a free row is written only when write_free.
        A plain grammar's rows are never free; a switching one's can be (grammars/switch/matcher.py)."""
        self._fill_checked(bitmask, row)
        return False

    def _fill_checked(self, bitmask: torch.Tensor, row: int) -> None:
        if self._terminated:
            bm.clear_row(bitmask, row)
            return
        self._native_fill(bitmask, row)
        self._set_eos_bits(bitmask, row, self._native_accepting())
        # Backends size their masks by V already; clearing the padding again costs a slice write
        # and makes "padded ids are never allowed" independent of backend versions.
        bm.clear_ids_from(bitmask, row, self._tokenizer_vocab, self._vocab_size)

    def _accepting_rows(self, bitmask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """[N] bool: does the grammar accept at each natively filled row (before anything else
        touched it)? Read off the row: both backends, given the tokenizer's EOS ids, set their bits
        exactly when the grammar accepts (tests/grammars/test_batch.py holds them to it)."""
        eos = min((t for t in self._eos if t < self._tokenizer_vocab), default=None)
        if eos is None:
            return torch.zeros(len(rows), dtype=torch.bool)
        return bm.bits_at(bitmask, rows, torch.full_like(rows, eos))

    def _finish_rows(self, bitmask: torch.Tensor, rows: torch.Tensor, accepting: torch.Tensor,
                     touched: bool = False) -> None:
        """`_fill_checked`'s rules after the native fill, for many rows at once (the batched pass,
        grammars/batch.py): EOS bits say whether the grammar accepts there; padding is cleared.
        The EOS bit `accepting` was read from already holds it, unless something `touched` it since."""
        first = min((t for t in self._eos if t < self._tokenizer_vocab), default=None)
        for t in self._eos:
            if t < self._tokenizer_vocab and (t != first or touched):
                bm.set_bit_rows(bitmask, rows, t, accepting)
        bm.clear_ids_from_rows(bitmask, rows, self._tokenizer_vocab, self._vocab_size)

    def _split(self, token_ids: Sequence[TokenId]) -> tuple[list[TokenId], bool]:
        """(body, eos_next): the in-vocabulary ids before the first EOS, and whether an EOS follows
        them (validate's view of a token list: EOS never reaches a backend)."""
        ids = self._in_vocab_prefix(token_ids)
        eos_at = next((i for i, t in enumerate(ids) if t in self._eos), len(ids))
        return ids[:eos_at], eos_at < len(ids)

    def _consumed(self, n: int, ends: bool) -> None:
        """Bookkeeping after a batched path advanced the native matcher by n tokens, the last one
        an EOS when `ends` (which the native matcher never saw): what accept does after consuming."""
        self._depth += n
        self._terminated = ends

    def _accepting_after(self, body: list[TokenId]) -> bool:
        """Would the grammar accept after the (valid) tokens body? State unchanged."""
        if not body:
            return self._native_accepting()
        self._native_consume(body)
        try:
            return self._native_accepting()
        finally:
            self._native_rollback(len(body))

    def _set_eos_bits(self, bitmask: torch.Tensor, row: int, allowed: bool) -> None:
        for eos in self._eos:
            if eos < self._tokenizer_vocab:
                bm.set_bit(bitmask, row, eos, allowed)

    def _in_vocab_prefix(self, token_ids: Sequence[TokenId]) -> list[TokenId]:
        ids: list[TokenId] = []
        for t in token_ids:
            t = int(t)
            if not 0 <= t < self._tokenizer_vocab:
                break
            ids.append(t)
        return ids
