"""Tables the grammar backends build from a vocabulary, kept on disk so that an engine starts without
building them again (seconds at Gemma 3's 262k ids, each start).

A table is bytes in the tokenizer's own cache folder (`Tokenizer.tables`; None, a tokenizer made in
memory: nothing is kept), named by what it is and by everything it is built from besides the
vocabulary: the library's version, the model's vocabulary size V, the stop ids. A change to any of
them names another file. Each file carries its length and CRC32, so a damaged, cut short or
unreadable file is built again and rewritten, never trusted. Writes go to a temporary name and are
renamed into place: a concurrent reader sees a whole table or none.

`pack_bytes` / `unpack_bytes` store a list of byte strings (a token's bytes each) compactly.
"""
from __future__ import annotations

import hashlib
import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from interlock.logs import get_logger
from interlock.models.tokenizer import Tokenizer

MAGIC = b"ILTABLE1"
HEADER = struct.Struct("<8sQI")            # magic, payload length, payload CRC32
log = get_logger(__name__)


def table_path(tokenizer: Tokenizer, name: str, parts: Sequence[object]) -> Path | None:
    """Where table `name` built with `parts` is kept for this tokenizer (None: it keeps none)."""
    if tokenizer.tables is None:
        return None
    digest = hashlib.sha256(repr((name, tuple(parts))).encode()).hexdigest()[:16]
    return tokenizer.tables / f"{name}-{digest}.table"


def load(tokenizer: Tokenizer, name: str, parts: Sequence[object]) -> bytes | None:
    """The kept table, or None where there is none or it does not check out."""
    path = table_path(tokenizer, name, parts)
    if path is None:
        return None
    try:
        data = path.read_bytes()
    except OSError:
        return None
    payload = _checked(data)
    if payload is None:
        log.warning("grammar.table_damaged", path=str(path), why="built again")
    return payload


def save(tokenizer: Tokenizer, name: str, parts: Sequence[object], payload: bytes) -> None:
    """Keep `payload` as table `name` (nothing where the tokenizer keeps no tables or the folder
    cannot be written: the table is then built at each start, as before)."""
    path = table_path(tokenizer, name, parts)
    if path is None:
        return
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload)
        os.replace(tmp, path)
    except OSError as exc:
        log.info("grammar.table_not_kept", path=str(path), error=str(exc))
    finally:
        tmp.unlink(missing_ok=True)


def _checked(data: bytes) -> bytes | None:
    if len(data) < HEADER.size:
        return None
    magic, length, crc = HEADER.unpack_from(data)
    payload = data[HEADER.size:]
    if magic != MAGIC or length != len(payload) or zlib.crc32(payload) != crc:
        return None
    return payload


def pack_bytes(items: Sequence[bytes]) -> bytes:
    """Byte strings as one blob: their count, their end offsets (uint64), then their bytes."""
    ends = np.cumsum([len(b) for b in items], dtype=np.uint64)
    return struct.pack("<Q", len(items)) + ends.tobytes() + b"".join(items)


def unpack_bytes(blob: bytes) -> tuple[bytes, ...]:
    """pack_bytes' byte strings (ValueError for a blob that is not one)."""
    (count,) = struct.unpack_from("<Q", blob)
    start = 8 + 8 * count
    if len(blob) < start:
        raise ValueError("not a packed list of byte strings")
    ends = np.frombuffer(blob, dtype=np.uint64, count=count, offset=8).tolist()
    if ends and ends[-1] != len(blob) - start:
        raise ValueError("not a packed list of byte strings")
    data = memoryview(blob)[start:]
    begins = [0, *ends[:-1]]
    return tuple(bytes(data[b:e]) for b, e in zip(begins, ends))
