"""A table's update watermarks: one per key bucket, beside its rows in the same tier.

W[b] is at least every version stored for a key of bucket b, so a row at or above its key's
bucket's watermark needs no per-key version read; :mod:`hps.tiers.versions` states the rule,
why this shortcut is sound, and how every write keeps it so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from hps.config.common import SIDE_TABLE_MARK
from hps.index import GOLDEN, mix
from hps.tiers.rows import RowStore
from hps.tiers.side_tables import UINT64_MAX, SideTable, Versions, from_limbs
from hps.types import Keys, TableSpec

log = logging.getLogger(__name__)

WATERMARK_SUFFIX = SIDE_TABLE_MARK + "watermark"

BUCKETS = 192
"""Key buckets of the watermarks: ``bucket = splitmix64(key) % BUCKETS``, the hash
``Publisher`` partitions by (:mod:`hps.updates.partition`). 192 = 2^6 x 3 is a multiple of
the partition counts 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96 and 192: with those, a
bucket's keys all travel in one partition, whose versions arrive in order, so a keyed stream
in order skips every per-key read. Small enough to read every bucket's watermark once per
batch. Never change it for a stored table."""


def bucket_of(keys: Keys) -> npt.NDArray[np.int64]:
    """The watermark bucket of each key."""
    h = mix(np.asarray(keys, dtype=np.int64).view(np.uint64) + GOLDEN)
    return (h % np.uint64(BUCKETS)).astype(np.int64)


def mark_key(buckets: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Where bucket ``b``'s watermark is stored: key ``-1 - b`` (partitions were >= 0)."""
    return np.asarray(-1 - buckets, dtype=np.int64)


ALL_BUCKETS = np.arange(BUCKETS, dtype=np.int64)
SYNC_KEY = np.array([-1 - BUCKETS], dtype=np.int64)
"""A row of the watermark side table written synced at the end of each applied batch (the
batch's highest version): what makes the batch durable. No watermark."""


def top_per_bucket(keys: Keys, versions: Versions) -> Versions:
    """The highest of ``versions`` in each bucket (0 where none), one vectorised pass."""
    top = np.zeros(BUCKETS, dtype=np.uint64)
    np.maximum.at(top, bucket_of(keys), np.asarray(versions, dtype=np.uint64))
    return top


class Watermarks(SideTable):
    """A table's watermarks W[b], one per key bucket: W[b] >= every version stored for a key
    of bucket b (the module docstring says why that makes the fast path sound).

    ``establish`` returns each bucket's highest stored version (a scan), for a tier that
    holds no watermark yet. A bucket whose watermark is missing while others exist (evicted
    by a bounded L2) counts as unbounded: its rows are checked key by key.
    """

    def __init__(
        self, store: RowStore, spec: TableSpec, establish: Callable[[], Versions] | None = None
    ) -> None:
        super().__init__(store, spec, WATERMARK_SUFFIX)
        self._establish = establish
        self._w = np.full(BUCKETS, UINT64_MAX, dtype=np.uint64)  # as last read or written
        self._known = np.zeros(BUCKETS, dtype=bool)

    def read(self, buckets: npt.NDArray[np.int64]) -> tuple[Versions, npt.NDArray[np.bool_]]:
        """The stored watermarks of ``buckets`` and whether each is stored."""
        limbs, found = self.store.fetch(self.spec.name, mark_key(buckets))
        w = np.full(buckets.size, UINT64_MAX, dtype=np.uint64)
        w[found] = from_limbs(limbs[found])
        return w, np.asarray(found, dtype=bool)

    def establish(self) -> None:
        """Give a tier that holds no watermark one per bucket (a scan of its versions)."""
        _, found = self.read(ALL_BUCKETS)
        if found.any():
            return
        if self._establish is None:
            raise ValueError(f"{self.spec.name}: no watermarks and no way to establish them")
        self.set(self._establish())
        log.info("%s: update watermarks established", self.spec.name)

    def set(self, w: Versions) -> None:
        """Store every bucket's watermark (synced); only :meth:`VersionedRows.reset_above`
        lowers them."""
        self.put(mark_key(ALL_BUCKETS), w, durable=True)
        self._w[:] = w
        self._known[:] = True

    def of(self, keys: Keys) -> Versions:
        """The watermark of each key's bucket, every bucket's read from the tier now (another
        writer, a partition's previous owner, may have raised them). A row at or above its
        bucket's watermark needs no per-key read."""
        self._w, self._known[:] = self.read(ALL_BUCKETS)[0], True
        return self._w[bucket_of(keys)]

    def cover(self, keys: Keys, versions: Versions) -> None:
        """Raise the watermarks of the keys' buckets to the highest of their ``versions``
        (not synced): called before those versions are stored. The raise is a compare and
        set in the tier: another writer's higher watermark, written since this one read
        them, stays."""
        if not keys.size:
            return
        top = top_per_bucket(keys, versions)
        touched = np.flatnonzero(top)  # a version 0 never raises anything
        unknown = touched[~self._known[touched]]
        if unknown.size:
            self._w[unknown], self._known[unknown] = self.read(unknown)[0], True
        raised = touched[top[touched] > self._w[touched]]
        if raised.size:
            self.raise_to(mark_key(raised), top[raised])
            self._w[raised] = top[raised]  # or higher: stored W is never below what we read

    def advance(self, keys: Keys, versions: Versions, *, durable: bool) -> None:
        """After a batch stored ``versions`` of ``keys``: the watermarks cover them, and
        with ``durable`` one is written synced, which syncs every write before it."""
        if not keys.size:
            return
        self.cover(keys, versions)
        if durable:  # any synced write syncs the writes before it: one small row
            last = np.array([versions.max()], dtype=np.uint64)
            self.put(SYNC_KEY, last, durable=True)
