"""Per-key update versions and per-partition watermarks, kept next to the data they protect.

They live in the same tier as the table's data (L3 when the table's updates go to L3, else
L2), so they live and die with the data, and a synced write of them also syncs the data
written before it (one RocksDB WAL). :class:`VersionedRows` is a table's rows and versions
over the tiers that take its updates (what the applier writes through, built by
:meth:`hps.tiers.Tiers.versioned`); :func:`key_versions` picks how per-key versions are kept:

- :class:`RowVersions`, for a tier with ``versioned_rows`` (``rocks_db``): the version is
  part of the stored row (:mod:`hps.storage.rocks_rows`), so an upsert is one put per row.
  Deleted keys keep their version in the side table below (a tombstone), and so do rows of
  databases written before this format: a key's stored version is its row's, else the side
  table's. Old databases are read as they are, not migrated; each updated row moves to the
  new format when it is written.
- :class:`SideVersions`, for the other tiers: the data row, plus the side table.

Side tables of ``<model>.<table>``:

- ``<model>.<table>__hps_version``: the version of each key's last applied update (for
  ``versioned_rows`` stores: of deletes, and of rows written before the format carried it).
  Deleted keys keep theirs, so a replayed older upsert cannot resurrect them.
- ``<model>.<table>__hps_watermark``: per Kafka partition, the highest version applied from
  it. A key's updates always travel in the same partition (the producer partitions by key),
  so a row whose version is at least its partition's watermark is newer than anything stored
  for its key and needs no per-key read: the common, in-order case costs no read at all.

A version (uint64) is stored as four float32 holding its 16-bit limbs, which every backend
keeps exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from hps.rowformat import Stored
from hps.tiers.rows import RowStore
from hps.types import Keys, TableSpec

Versions = npt.NDArray[np.uint64]

VERSION_SUFFIX = "__hps_version"
WATERMARK_SUFFIX = "__hps_watermark"
LIMBS = 4
UINT64_MAX = np.uint64(2**64 - 1)
_SHIFTS = np.arange(LIMBS, dtype=np.uint64) * np.uint64(16)
_MASK = np.uint64(0xFFFF)


def to_limbs(versions: npt.ArrayLike) -> npt.NDArray[np.float32]:
    v = np.asarray(versions, dtype=np.uint64)
    return ((v[:, None] >> _SHIFTS[None, :]) & _MASK).astype(np.float32)


def from_limbs(limbs: npt.ArrayLike) -> Versions:
    parts = np.asarray(limbs, dtype=np.float32).astype(np.uint64)
    return np.bitwise_or.reduce(parts << _SHIFTS[None, :], axis=1).astype(np.uint64)


class _SideTable:
    def __init__(self, store: RowStore, spec: TableSpec, suffix: str) -> None:
        self.store = store
        self.spec = TableSpec(model=spec.model, table=spec.table + suffix, dim=LIMBS)
        store.open_table(self.spec)

    def get(self, keys: Keys) -> Versions:
        """Stored versions of ``keys`` (0 where none)."""
        limbs, found = self.store.fetch(self.spec.name, keys)
        versions = np.zeros(keys.size, dtype=np.uint64)
        versions[found] = from_limbs(limbs[found])
        return versions

    def put(self, keys: Keys, versions: Versions, *, durable: bool) -> None:
        """Store versions; ``durable`` syncs this write and every write before it."""
        limbs = to_limbs(versions)
        self.store.insert(self.spec.name, keys, limbs, durable=durable)


class VersionTable(_SideTable):
    """Per-key versions of one table (0 means never updated)."""

    def __init__(self, store: RowStore, spec: TableSpec) -> None:
        super().__init__(store, spec, VERSION_SUFFIX)


class Watermarks(_SideTable):
    """Per-partition highest applied version of one table, cached after the first read."""

    def __init__(self, store: RowStore, spec: TableSpec) -> None:
        super().__init__(store, spec, WATERMARK_SUFFIX)
        self._known: dict[int, np.uint64] = {}

    def of(self, partitions: npt.NDArray[np.int64]) -> Versions:
        """The watermark of each row's partition; rows of unknown partition (< 0) get the max."""
        uniq = np.unique(partitions)
        missing = [int(p) for p in uniq if p >= 0 and int(p) not in self._known]
        if missing:
            got = self.get(np.array(missing, dtype=np.int64))
            self._known.update(zip(missing, got, strict=True))
        table = {int(p): self._known.get(int(p), UINT64_MAX) for p in uniq}
        lookup = np.array([table[int(p)] for p in uniq], dtype=np.uint64)
        return lookup[np.searchsorted(uniq, partitions)]

    def advance(
        self, partitions: npt.NDArray[np.int64], versions: Versions, *, durable: bool
    ) -> None:
        """Raise the watermarks to the highest version each partition delivered."""
        known = partitions >= 0
        if not known.any():
            return
        parts, vers = partitions[known], versions[known]
        order = np.lexsort((vers, parts))
        last = np.ones(order.size, dtype=bool)
        last[:-1] = parts[order][1:] != parts[order][:-1]
        top_p, top_v = parts[order][last], vers[order][last]
        current = self.of(top_p)
        newer = top_v > current
        if newer.any():
            self.put(top_p[newer].astype(np.int64), top_v[newer], durable=durable)
            self._known.update(zip(top_p[newer].tolist(), top_v[newer], strict=True))


class SideVersions:
    """Per-key versions of a table in a tier without ``versioned_rows``: data + side table."""

    def __init__(self, store: RowStore, spec: TableSpec) -> None:
        self.store, self.name = store, spec.name
        self.side = VersionTable(store, spec)

    def get(self, keys: Keys) -> Versions:
        """Stored versions of ``keys`` (0 where none)."""
        return self.side.get(keys)

    def upsert(self, keys: Keys, values: Stored, versions: Versions, *, durable: bool) -> None:
        self.store.insert(self.name, keys, values)
        self.side.put(keys, versions, durable=durable)

    def delete(self, keys: Keys, versions: Versions, *, durable: bool) -> None:
        self.store.remove(self.name, keys)
        self.side.put(keys, versions, durable=durable)


class RowVersions(SideVersions):
    """Per-key versions carried in the rows of a ``versioned_rows`` store (one put per row).

    The side table keeps the versions of deleted keys and of rows of the older format.
    """

    def get(self, keys: Keys) -> Versions:
        versions, has_version = self.store.fetch_versions(self.name, keys)
        rest = ~has_version
        if rest.any():
            versions[rest] = self.side.get(keys[rest])
        return np.asarray(versions, dtype=np.uint64)

    def upsert(self, keys: Keys, values: Stored, versions: Versions, *, durable: bool) -> None:
        self.store.insert_versioned(self.name, keys, values, versions, durable=durable)


def key_versions(store: RowStore, spec: TableSpec) -> SideVersions:
    """How ``store`` keeps the per-key versions of ``spec`` (see the module docstring)."""
    if store.versioned_rows:
        return RowVersions(store, spec)
    return SideVersions(store, spec)


class VersionedRows:
    """A table's rows and update versions over the tiers that take its updates.

    ``tiers[0]`` (L3 when it takes them) keeps the data with the per-key versions and the
    partition watermarks; the others get the data only. The writes of one call go to
    ``tiers[0]`` first (see :mod:`hps.updates.applier` for why the order is safe).
    """

    def __init__(self, spec: TableSpec, tiers: Sequence[RowStore]) -> None:
        if not tiers:
            raise ValueError(f"{spec.name}: no tier takes its updates")
        self.spec = spec
        self.tiers = list(tiers)
        for tier in self.tiers:
            tier.open_table(spec)
        self.versions = key_versions(self.tiers[0], spec)
        self.watermarks = Watermarks(self.tiers[0], spec)

    def stored(self, keys: Keys) -> Versions:
        """The version of each key's last applied update (0: never updated)."""
        return self.versions.get(keys)

    def write(
        self,
        upserts: tuple[Keys, Stored, Versions],
        deletes: tuple[Keys, Versions],
        *,
        durable: bool,
    ) -> None:
        """Upserted rows with their versions and deleted keys with theirs (tombstones) to the
        first tier (``durable``: synced), then the rows and the deletes to the others."""
        up_keys, up_values, up_versions = upserts
        rm_keys, rm_versions = deletes
        if up_keys.size:
            self.versions.upsert(up_keys, up_values, up_versions, durable=durable)
        if rm_keys.size:
            self.versions.delete(rm_keys, rm_versions, durable=durable)
        for tier in self.tiers[1:]:
            if up_keys.size:
                tier.insert(self.spec.name, up_keys, up_values)
            if rm_keys.size:
                tier.remove(self.spec.name, rm_keys)


def last_version(store: RowStore, spec: TableSpec) -> int | None:
    """The highest update version applied to a table (its partitions' watermarks)."""
    marks = Watermarks(store, spec)
    top = [int(from_limbs(limbs).max()) for _, limbs in store.dump(marks.spec.name) if limbs.size]
    return max(top) if top else None
