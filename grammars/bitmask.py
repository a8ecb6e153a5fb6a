"""Token bitmasks: int32 [rows, W] with W = ceil(V/32); bit j of word i set = token 32*i + j allowed.

V is the *model's* vocabulary size, which may exceed the tokenizer's; ids in the padding are
never allowed. These helpers are the only place that knows the bit layout.
"""
from __future__ import annotations

import torch

from interlock.protocol.types import TokenId

BITS = 32


def words_for(vocab_size: int) -> int:
    """W = ceil(V/32): int32 words per mask row."""
    return (vocab_size + BITS - 1) // BITS


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """[rows, W] int32, every bit set (all allowed), on CPU (the backends fill host memory)."""
    if rows <= 0 or vocab_size <= 0:
        raise ValueError(f"rows and vocab_size must be positive, got {rows}, {vocab_size}")
    return torch.full((rows, words_for(vocab_size)), -1, dtype=torch.int32)


def check_bitmask(bitmask: torch.Tensor, row: int, vocab_size: int) -> None:
    """Raise ValueError unless bitmask is a CPU contiguous int32 [rows, W] tensor holding `row`."""
    if not isinstance(bitmask, torch.Tensor) or bitmask.dtype != torch.int32 or bitmask.dim() != 2:
        raise ValueError("bitmask must be a 2-D int32 torch tensor")
    if bitmask.device.type != "cpu" or not bitmask.is_contiguous():
        raise ValueError("bitmask must be a contiguous CPU tensor (fill on host, copy to device after)")
    if bitmask.shape[1] != words_for(vocab_size):
        raise ValueError(f"bitmask has {bitmask.shape[1]} words per row, vocab {vocab_size} needs "
                         f"{words_for(vocab_size)}")
    if not 0 <= row < bitmask.shape[0]:
        raise ValueError(f"row {row} out of range for a bitmask of {bitmask.shape[0]} rows")


def clear_row(bitmask: torch.Tensor, row: int) -> None:
    """Refuse every token in `row`."""
    bitmask[row].zero_()


def set_only(bitmask: torch.Tensor, row: int, token_ids: list[TokenId]) -> None:
    """Row allows exactly `token_ids`."""
    bitmask[row].zero_()
    for t in token_ids:
        word, bit = divmod(t, BITS)
        bitmask[row, word] |= _bit(bit)


def clear_ids_from(bitmask: torch.Tensor, row: int, first: int, vocab_size: int) -> None:
    """Clear bits for ids first..(32*W - 1): the padding past the tokenizer's vocabulary."""
    end = words_for(vocab_size) * BITS
    if first >= end:
        return
    word, bit = divmod(first, BITS)
    if bit:
        bitmask[row, word] &= _low_bits(bit)
        word += 1
    bitmask[row, word:] = 0


def set_bit(bitmask: torch.Tensor, row: int, token_id: TokenId, allowed: bool) -> None:
    word, bit = divmod(token_id, BITS)
    if allowed:
        bitmask[row, word] |= _bit(bit)
    else:
        bitmask[row, word] &= ~_bit(bit)


def allowed_ids(bitmask: torch.Tensor, row: int, vocab_size: int) -> list[TokenId]:
    """Token ids whose bit is set in `row` (for tests and debugging; O(V))."""
    words = bitmask[row].to(torch.int64) & 0xFFFFFFFF                      # [W], unsigned view
    shifts = torch.arange(BITS, dtype=torch.int64)                         # [32]
    bits = ((words[:, None] >> shifts[None, :]) & 1).flatten()[:vocab_size]  # [V]
    return bits.nonzero().flatten().tolist()


def is_allowed(bitmask: torch.Tensor, row: int, token_id: TokenId) -> bool:
    word, bit = divmod(token_id, BITS)
    return bool((int(bitmask[row, word]) >> bit) & 1)


def _bit(bit: int) -> int:
    """int32 value with only `bit` set (bit 31 is the sign bit)."""
    return -(1 << 31) if bit == 31 else 1 << bit


def _low_bits(bit: int) -> int:
    """int32 value with bits 0..bit-1 set."""
    return (1 << bit) - 1


# --- many rows at once (the batched step pass, grammars/batch.py) -------------------------------

def bits_at(bitmask: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """[N] bool: is token_ids[i] allowed in row rows[i]? (ids must be in 0..32*W-1)"""
    words = bitmask[rows, token_ids // BITS]                                # [N] int32
    return ((words >> (token_ids % BITS).to(torch.int32)) & 1).bool()


def set_bit_rows(bitmask: torch.Tensor, rows: torch.Tensor, token_id: TokenId, allowed: torch.Tensor) -> None:
    """Bit token_id of each row rows[i] becomes allowed[i] ([N] bool)."""
    word, bit = divmod(token_id, BITS)
    column = bitmask[rows, word]                                           # [N] int32
    bitmask[rows, word] = torch.where(allowed, column | _bit(bit), column & ~_bit(bit))


def clear_ids_from_rows(bitmask: torch.Tensor, rows: torch.Tensor, first: int, vocab_size: int) -> None:
    """clear_ids_from for each row in rows."""
    end = words_for(vocab_size) * BITS
    if first >= end:
        return
    word, bit = divmod(first, BITS)
    if bit:
        bitmask[rows, word] &= _low_bits(bit)
        word += 1
    if word < bitmask.shape[1]:
        bitmask[rows, word:] = 0
