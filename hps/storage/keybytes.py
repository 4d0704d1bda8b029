"""Keys as the bytes the Redis and RocksDB backends store them as (the order of those bytes:
:func:`hps.dedup.stored_order`)."""

from __future__ import annotations

from hps.types import Keys


def key_bytes(keys: Keys) -> list[bytes]:
    """Each int64 key as its 8 little-endian bytes (one C-level pass, zero bytes kept)."""
    out: list[bytes] = keys.astype("<i8", copy=False).view("V8").tolist()
    return out
