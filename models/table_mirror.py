"""The host's side of device block tables and pinned buffers, shared by the device runner's step
staging (actors/device/staging.py) and its draft model's (drafters/device_draft.py): a mirror of the
tables that turns a sequence's new blocks into the few (flat index, block) writes a step scatters
on the device, and numpy views through which host buffers are written without building tensors."""
from __future__ import annotations

from dataclasses import fields

import numpy as np


def numpy_views(buffers: object) -> dict[str, np.ndarray]:
    """Numpy views of a host dataclass's tensors (same memory): how the prologue writes them."""
    return {f.name: getattr(buffers, f.name).numpy() for f in fields(buffers)}  # type: ignore[arg-type]


class TableMirror:
    """The host's copy of the device block tables, one row per slot (actors/device/staging.py)."""

    def __init__(self, slots: int, max_blocks: int) -> None:
        self.width = max_blocks
        self.known: list[list[int]] = [[] for _ in range(slots)]
        self.owner: list[int | None] = [None] * slots      # the KV sequence whose table a row holds

    def updates(self, slot: int, seq: int, table: tuple[int, ...], out: list[tuple[int, int]]) -> None:
        """Append to `out` the (flat index, block) writes that make row `slot` hold `table`."""
        if len(table) > self.width:
            raise ValueError(f"sequence {seq} has {len(table)} blocks, the tables hold {self.width}")
        known = self.known[slot] if self.owner[slot] == seq else []
        start = 0
        limit = min(len(known), len(table))
        while start < limit and known[start] == table[start]:
            start += 1
        base = slot * self.width
        out.extend((base + j, table[j]) for j in range(start, len(table)))
        self.known[slot], self.owner[slot] = list(table), seq
