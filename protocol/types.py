"""Small aliases shared by every folder, so signatures say what an int means."""
from __future__ import annotations

from typing import Literal, TypeAlias

TokenId: TypeAlias = int
RequestId: TypeAlias = str
SeqId: TypeAlias = int          # one sequence in the KV cache (a request may own several: CFG)
SlotId: TypeAlias = int         # a row of the batch, 0..max_batch_size-1
BlockId: TypeAlias = int        # one block of the paged KV pool

Dtype: TypeAlias = Literal["float32", "bfloat16", "float16"]
FinishReason: TypeAlias = Literal["stop", "length", "grammar", "cancelled", "error"]
