"""The keys this process writes to or removes from an L2, so that a backfill of an L3 row
read before such a write never puts the older row back (:meth:`hps.tiers.Tiers.backfill`)."""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache

import numpy as np

from hps.cache.writelog import WriteLog
from hps.rowformat import Stored
from hps.tiers.rows import RowStore
from hps.tiers.side_tables import Versions
from hps.tiers.versions import VersionedRows
from hps.types import Keys, TableSpec

L2_LOG_KEYS = 1 << 18
"""Keys the log of this process's L2 writes keeps (:class:`L2Writes`): 3 MiB a process. A
backfill whose read is older than what it keeps is dropped whole (L2 is only a cache)."""


@lru_cache(maxsize=4096)
def _table_salt(table: str) -> int:
    """A 64-bit number per table, XORed into its keys in :class:`L2Writes`' one log."""
    digest = hashlib.blake2b(table.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


class L2Writes:
    """The keys this process writes to or removes from one L2, so that a backfill of an L3
    row read before such a write skips the key (:meth:`Tiers.backfill`): as L1's write log
    (:class:`hps.cache.writelog.WriteLog`) guards L1 fills, over the same log.

    A write holds its keys (:meth:`writing`) from before its first tier to after its last:
    meanwhile they count as written after every token, and at its end they are recorded
    once more. A backfill checks its keys and inserts the rest under one lock, which a
    write takes to start and to end: a backfill that ran before a write started is
    undone by that write's L2 step; one after it began skips its keys. A write of more
    keys than the log keeps, or of a whole table (``keys=None``: a refill), makes every
    backfill skip until it ends, and then drops every backfill whose token is older (so
    does one that would hold more keys than that with the writes under way).

    Keys of every table share one log, each table's keys XORed with a number of its own: a
    key of another table that lands on the same number only costs a backfill. Bounded:
    :data:`L2_LOG_KEYS` keys (12 bytes each), plus the keys of the writes under way.
    Writes of other processes (a shared L2) are not in it.
    """

    def __init__(self, limit: int = L2_LOG_KEYS) -> None:
        self._log = WriteLog(np, limit)
        self._lock = threading.Lock()
        self._wide = 0  # whole-table or oversized writes under way

    def token(self) -> int:
        """The version to pass a backfill of rows read after this call: one int read, no
        lock (a version read a moment early only makes more keys count as written)."""
        return self._log.version

    @contextmanager
    def writing(self, table: str, keys: Keys | None) -> Iterator[None]:
        """Around a write of ``keys`` of ``table`` to L2 (``None``: every key of it)."""
        tagged = None if keys is None else np.asarray(keys, dtype=np.int64) ^ _table_salt(table)
        hold = None
        with self._lock:
            if tagged is None or tagged.size + self._log.held > self._log.limit:
                self._wide += 1
            else:
                hold = self._log.hold(tagged)
        try:
            yield
        finally:
            with self._lock:
                if hold is None:
                    self._wide -= 1
                    self._log.clear()
                else:
                    self._log.release(hold)

    def insert_absent(
        self, store: RowStore, table: str, keys: Keys, values: Stored, since: int
    ) -> int:
        """``store.insert_absent`` of the keys not written since ``since``, under the lock;
        how many keys were offered."""
        with self._lock:
            if self._wide:
                return 0
            keep = ~self._log.since(keys ^ _table_salt(table), since)
            if not keep.any():
                return 0
            if not keep.all():
                keys, values = keys[keep], values[keep]
            store.insert_absent(table, keys, values)
            return int(keys.size)


_L2_WRITES: weakref.WeakKeyDictionary[RowStore, L2Writes] = weakref.WeakKeyDictionary()
_L2_WRITES_LOCK = threading.Lock()


def writes_of(store: RowStore) -> L2Writes:
    """The log of ``store``'s writes in this process (one per L2, whichever :class:`Tiers`
    views it: :meth:`Tiers.subset` shares it)."""
    with _L2_WRITES_LOCK:
        writes = _L2_WRITES.get(store)
        if writes is None:
            writes = _L2_WRITES[store] = L2Writes()
        return writes


class GuardedRows(VersionedRows):
    """:class:`VersionedRows` whose writes hold their keys in L2's :class:`L2Writes`."""

    def __init__(self, spec: TableSpec, tiers: list[RowStore], writes: L2Writes) -> None:
        super().__init__(spec, tiers)
        self._writes = writes

    def write(
        self,
        upserts: tuple[Keys, Stored, Versions],
        deletes: tuple[Keys, Versions],
        *,
        durable: bool,
        first_done: Callable[[], None] | None = None,
    ) -> None:
        keys = np.concatenate([upserts[0], deletes[0]]).astype(np.int64, copy=False)
        with self._writes.writing(self.spec.name, keys):
            super().write(upserts, deletes, durable=durable, first_done=first_done)
