"""Damaged data in ``rocks_db``: reads that isolate it, scans and checks that report it.

RocksDB verifies a block's checksum when it reads it and answers a damaged block (a checksum
mismatch, a malformed block) with its ``Corruption`` status; rocksdict then fails a whole
MultiGet, and its iterators end at the block as they end at the last key.

- :func:`multiget` fails only the keys stored in a damaged block: a MultiGet that meets one
  is split in halves until the damaged keys are isolated (about ``2 log2(n)`` MultiGets per
  damaged key, once: :class:`DamagedKeys` remembers them until they are written again, or
  until a secondary catches up), and :func:`damaged_rows_error` is the
  :class:`hps.errors.DamagedRowsError` a fetch raises, naming the table and carrying the
  rows of every other key (:class:`hps.tiers.Tiers` serves those and counts the damaged
  ones).
- :func:`check_scan`: a scan (``dump``, ``size``) checks the iterator's status at its end,
  so one that stopped at a damaged block raises instead of ending early.
- :func:`verify_cf` reads a whole column family with checksums verified (``hps verify``).
"""

from __future__ import annotations

from typing import cast

import numpy as np
import rocksdict as rd

from hps.errors import BackendError, DamagedRowsError
from hps.io.chunks import rows_per_chunk
from hps.rowformat import Stored
from hps.storage import rocks_rows
from hps.types import Keys, Mask, TableSpec

RdictKey = str | int | float | bytes | bool
"""A key as rocksdict's stubs type it (in raw mode, ours are always bytes)."""


def is_damage(exc: Exception) -> bool:
    """Whether rocksdict's exception is RocksDB's ``Corruption`` status (a block checksum
    mismatch, a malformed block): the data is damaged, not the call."""
    return str(exc).startswith("Corruption")


def multiget(cf: rd.Rdict, wanted: list[RdictKey]) -> tuple[list[bytes | None], list[int], str]:
    """MultiGet ``wanted``; a damaged block fails only the keys stored in it.

    Returns the values (None: absent or damaged), the positions of the damaged keys and the
    first damage's message. A failed MultiGet is split in halves, recursively, down to the
    keys that cannot be read (the others are read in the halves that succeed).
    """
    got: list[bytes | None] = [None] * len(wanted)
    damaged: list[int] = []
    first = ""
    todo = [(0, len(wanted))]
    while todo:
        lo, hi = todo.pop()
        try:
            got[lo:hi] = cast("list[bytes | None]", cf.get(wanted[lo:hi]))
        except Exception as exc:
            if not is_damage(exc):
                raise
            first = first or str(exc)
            if hi - lo == 1:
                damaged.append(lo)
            else:
                mid = (lo + hi) // 2
                todo += [(lo, mid), (mid, hi)]
    return got, damaged, first


class DamagedKeys:
    """Per table: the keys found in damaged blocks (sorted), skipped by later reads, and the
    first damage RocksDB reported."""

    def __init__(self) -> None:
        self._keys: dict[str, Keys] = {}
        self._first: dict[str, str] = {}

    def skip(self, table: str, keys: Keys) -> Mask:
        """Which of ``keys`` are known to sit in damaged blocks."""
        known = self._keys.get(table)
        return np.isin(keys, known) if known is not None else np.zeros(keys.size, bool)

    def remember(self, table: str, keys: Keys, why: str) -> None:
        """Add keys found in damaged blocks; ``why``: the damage's message."""
        self._first.setdefault(table, why)
        known = self._keys.get(table)
        self._keys[table] = keys if known is None else np.union1d(known, keys)

    def forget(self, table: str, keys: Keys) -> None:
        """Keys written or removed again: their damaged rows are shadowed."""
        known = self._keys.get(table)
        if known is not None:
            left = np.setdiff1d(known, keys)
            if left.size:
                self._keys[table] = left
            else:
                del self._keys[table]
                self._first.pop(table, None)

    def known(self, table: str) -> bool:
        """Whether keys of the table were found in damaged blocks."""
        return table in self._keys

    def drop(self, table: str) -> None:
        """The table was dropped: its damaged keys are gone with it."""
        self._keys.pop(table, None)
        self._first.pop(table, None)

    def why(self, table: str) -> str:
        """The first damage reported for the table."""
        return self._first.get(table, "damaged")

    def clear(self) -> None:
        """Forget every table's damaged keys (a secondary caught up: the writer may have
        rewritten them)."""
        self._keys.clear()
        self._first.clear()


def damaged_rows_error(
    path: str, table: str, asked: int, values: Stored, found: Mask, damaged: Mask, why: str
) -> DamagedRowsError:
    """The error of a fetch of ``asked`` keys of ``table`` whose ``damaged`` ones sit in
    damaged blocks of the database at ``path``; it carries the rows of the others."""
    return DamagedRowsError(
        f"rocks_db: {int(damaged.sum())} of {asked} keys of {table} sit in damaged blocks of "
        f"{path} ({why}); run hps verify, then re-import the table with hps import --force "
        "(which drops its damaged files)",
        values,
        found,
        damaged,
    )


def check_scan(table: str, cf: rd.Rdict, last: RdictKey | None, rows: int) -> None:
    """Raise if a scan that ended after key ``last`` (None: no row) stopped at an error.

    rocksdict's iterators end at a damaged block as they end at the last key; its status
    says which. A fresh iterator stepping past ``last`` meets the same block."""
    it = cf.iter()
    if last is None:
        it.seek_to_first()
    else:
        it.seek(last)
        if it.valid():
            it.next()
    try:
        it.status()
    except Exception as exc:
        raise BackendError(
            f"rocks_db: {table} is damaged: a scan stopped after {rows} rows ({exc}); "
            "run hps verify, then re-import the table with hps import --force (which drops its "
            "damaged files)"
        ) from exc
    if it.valid():  # rows after the end: the scan stopped for another reason
        raise BackendError(f"rocks_db: a scan of {table} stopped after {rows} rows")


def _scan_options() -> rd.ReadOptions:
    """A whole-table read: every block's checksum verified, none kept in the block cache."""
    ro = rd.ReadOptions()
    ro.set_verify_checksums(True)
    ro.fill_cache(False)  # type: ignore[call-arg]  # the stub omits its argument
    ro.set_readahead_size(2 << 20)
    return ro


def verify_cf(cf: rd.Rdict, spec: TableSpec | None) -> tuple[int, str | None]:
    """Read the whole column family ``cf`` with every block's checksum verified (and, for a
    table's, with its ``spec``, every row's length); ``(rows read, None)`` when intact, else
    ``(rows read before the damage, why)``."""
    it = cf.iter(_scan_options())
    it.seek_to_first()
    rows, vals = 0, []
    chunk = 0 if spec is None else rows_per_chunk(spec.fmt.row_bytes(spec.dim))
    try:
        while it.valid():
            if spec is not None:
                vals.append(it.value())
                if len(vals) == chunk:
                    rocks_rows.decode(vals, spec.fmt, spec.dim)
                    vals.clear()
            rows += 1
            it.next()
        it.status()
        if vals and spec is not None:
            rocks_rows.decode(vals, spec.fmt, spec.dim)
    except Exception as exc:
        return rows, str(exc)
    return rows, None
