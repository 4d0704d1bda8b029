"""The value format of ``rocks_db`` rows: the stored row, then the row's update version.

Format 2 (written since the update path carries versions with the data): the stored row's
bytes (the table's row format, :mod:`hps.rowformat`: ``fmt.row_bytes(dim)`` bytes, e.g.
``dim`` little-endian float32 for float32 tables) followed by one uint64 (little-endian), the
version of the Kafka update that wrote the row (0 for rows written by an import or
``insert``). One put per row stores the row and its version together, so the applier writes
each row once.

Format 1 (databases written before): the float32 row alone (such databases hold float32
rows only). Such rows are read as they are, with no version (``has_version`` false: the
applier then looks in the legacy version side table, :mod:`hps.tiers.versions`); they are not
migrated in place, but every row an update or an import rewrites is written in format 2, so a
database converges as it is updated. Both formats may sit in one column family; a read
tells them apart by length.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from itertools import compress
from typing import cast

import numpy as np

from hps.rowformat import RowFormat, Stored
from hps.types import Keys

VERSION_BYTES = 8


@lru_cache(maxsize=64)
def row_dtype(fmt: RowFormat, dim: int) -> np.dtype:
    """One stored row of format 2, packed: ``v`` (the stored row) then ``ver`` (uint64)."""
    return np.dtype([("v", fmt.dtype.newbyteorder("<"), (fmt.width(dim),)), ("ver", "<u8")])


def encode(values: Stored, versions: np.ndarray | None) -> list[bytes]:
    """Format-2 value bytes of each stored row (one ``bytes`` per row: what rocksdict takes)."""
    n, width = values.shape
    rec = np.empty(n, dtype=[("v", values.dtype, (width,)), ("ver", "<u8")])
    rec["v"] = values
    rec["ver"] = 0 if versions is None else versions
    rows: list[bytes] = rec.view(f"V{rec.dtype.itemsize}").tolist()
    return rows


def decode(
    got: Sequence[bytes | None], fmt: RowFormat, dim: int
) -> tuple[Stored, np.ndarray, np.ndarray, np.ndarray]:
    """``(stored rows, found, versions, has_version)`` of MultiGet results (None: absent).

    Rows of format 1 are found with ``has_version`` false and version 0.
    """
    n = len(got)
    values = np.zeros((n, fmt.width(dim)), dtype=fmt.dtype)
    versions = np.zeros(n, dtype=np.uint64)
    found = np.fromiter(map(bool, got), dtype=np.bool_, count=n)
    has_version = np.zeros(n, dtype=bool)
    m = int(found.sum())
    if m == 0:
        return values, found, versions, has_version
    present = cast("list[bytes]", list(compress(got, found)))  # the found ones: no None
    blob = b"".join(present)
    old = fmt.row_bytes(dim)
    new = old + VERSION_BYTES
    if len(blob) == m * new:  # all format 2: one structured view
        rec = np.frombuffer(blob, dtype=row_dtype(fmt, dim))
        values[found] = rec["v"]
        versions[found] = rec["ver"]
        has_version[found] = True
    elif len(blob) == m * old:  # all format 1
        values[found] = fmt.from_bytes(blob, dim)
    else:  # a mixed batch (an old database part-way through being updated)
        lengths = np.fromiter(map(len, present), dtype=np.int64, count=m)
        bad = (lengths != new) & (lengths != old)
        if bad.any():
            sizes = sorted(set(lengths[bad].tolist()))
            raise ValueError(
                f"stored rows of {sizes} bytes, expected {old} or {new} for {fmt.name} rows "
                f"of dim {dim}"
            )
        starts = np.cumsum(lengths) - lengths
        raw = np.frombuffer(blob, dtype=np.uint8)
        rows = np.flatnonzero(found)
        values[rows] = fmt.from_bytes(raw[starts[:, None] + np.arange(old)].tobytes(), dim)
        is_new = lengths == new
        tail = raw[starts[is_new, None] + old + np.arange(VERSION_BYTES)].view("<u8")
        versions[rows[is_new]] = tail.reshape(-1)
        has_version[rows[is_new]] = True
    return values, found, versions, has_version


def decode_items(
    keys: list[bytes], vals: list[bytes], fmt: RowFormat, dim: int
) -> tuple[Keys, Stored]:
    """Keys and stored rows of a scan (``dump``), either format. Every row of a scan is
    present: rows all of format 2 are copied once out of their joined bytes (no buffer of
    zeros, no mask), others decoded as :func:`decode` does."""
    k = np.frombuffer(b"".join(keys), dtype="<i8").astype(np.int64)
    blob = b"".join(vals)
    if len(blob) == len(vals) * (fmt.row_bytes(dim) + VERSION_BYTES):
        return k, np.frombuffer(blob, dtype=row_dtype(fmt, dim))["v"].astype(fmt.dtype)
    del blob
    v, _, _, _ = decode(vals, fmt, dim)
    return k, v
