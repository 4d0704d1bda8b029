"""The value format of ``rocks_db`` rows: the float32 vector, then the row's update version.

Format 2 (written since the update path carries versions with the data): ``dim`` float32
(little-endian) followed by one uint64 (little-endian), the version of the Kafka update that
wrote the row (0 for rows written by an import or ``insert``). One put per row stores the
value and its version together, so the applier writes each row once.

Format 1 (databases written before): the ``dim`` float32 alone. Such rows are read as they
are, with no version (``has_version`` false: the applier then looks in the legacy version
side table, :mod:`hps.tiers.versions`); they are not migrated in place, but every row an
update or an import rewrites is written in format 2, so a database converges as it is
updated. Both formats may sit in one column family; a read tells them apart by length.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from itertools import compress
from typing import cast

import numpy as np

from hps.types import Keys, Vectors

VERSION_BYTES = 8


@lru_cache(maxsize=64)
def row_dtype(dim: int) -> np.dtype:
    """One stored row of format 2, packed: ``v`` (dim float32) then ``ver`` (uint64)."""
    return np.dtype([("v", "<f4", (dim,)), ("ver", "<u8")])


def encode(values: Vectors, versions: np.ndarray | None) -> list[bytes]:
    """Format-2 value bytes of each row (one ``bytes`` per row: what rocksdict takes)."""
    n, dim = values.shape
    rec = np.empty(n, dtype=row_dtype(dim))
    rec["v"] = values
    rec["ver"] = 0 if versions is None else versions
    rows: list[bytes] = rec.view(f"V{rec.dtype.itemsize}").tolist()
    return rows


def decode(
    got: Sequence[bytes | None], dim: int
) -> tuple[Vectors, np.ndarray, np.ndarray, np.ndarray]:
    """``(values, found, versions, has_version)`` of MultiGet results (None: absent).

    Rows of format 1 are found with ``has_version`` false and version 0.
    """
    n = len(got)
    values = np.zeros((n, dim), dtype=np.float32)
    versions = np.zeros(n, dtype=np.uint64)
    found = np.fromiter(map(bool, got), dtype=np.bool_, count=n)
    has_version = np.zeros(n, dtype=bool)
    m = int(found.sum())
    if m == 0:
        return values, found, versions, has_version
    present = cast("list[bytes]", list(compress(got, found)))  # the found ones: no None
    blob = b"".join(present)
    new, old = 4 * dim + VERSION_BYTES, 4 * dim
    if len(blob) == m * new:  # all format 2: one structured view
        rec = np.frombuffer(blob, dtype=row_dtype(dim))
        values[found] = rec["v"]
        versions[found] = rec["ver"]
        has_version[found] = True
    elif len(blob) == m * old:  # all format 1
        values[found] = np.frombuffer(blob, dtype="<f4").reshape(m, dim)
    else:  # a mixed batch (an old database part-way through being updated)
        lengths = np.fromiter(map(len, present), dtype=np.int64, count=m)
        bad = (lengths != new) & (lengths != old)
        if bad.any():
            raise ValueError(f"stored rows of {sorted(set(lengths[bad].tolist()))} bytes, "
                             f"expected {old} or {new} for dim {dim}")  # fmt: skip
        starts = np.cumsum(lengths) - lengths
        raw = np.frombuffer(blob, dtype=np.uint8)
        floats = raw[starts[:, None] + np.arange(old)].view("<f4")
        rows = np.flatnonzero(found)
        values[rows] = floats
        is_new = lengths == new
        tail = raw[starts[is_new, None] + old + np.arange(VERSION_BYTES)].view("<u8")
        versions[rows[is_new]] = tail.reshape(-1)
        has_version[rows[is_new]] = True
    return values, found, versions, has_version


def decode_items(keys: list[bytes], vals: list[bytes], dim: int) -> tuple[Keys, Vectors]:
    """Keys and vectors of a scan (``dump``), either format."""
    k = np.frombuffer(b"".join(keys), dtype="<i8").astype(np.int64)
    v, _, _, _ = decode(vals, dim)
    return k, v
