"""Per-key update versions and a table-wide watermark, kept next to the data they protect.

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
- ``<model>.<table>__hps_watermark``: under key ``-1 - b``, the **watermark** ``W[b]`` of
  key bucket ``b`` (:data:`BUCKETS` buckets by a hash of the key, :class:`Watermarks`); below
  "W" is the watermark of a row's key's bucket. Keys ``0, 1, ...`` hold the per-partition
  watermarks of databases written before these existed; nothing reads them any more but
  :func:`last_version` of such a database.

A version (uint64) is stored as four float32 holding its 16-bit limbs, which every backend
keeps exactly.

The rule and the shortcut
-------------------------

**Rule**: a row is applied only if its version is >= its key's stored version (0: never
updated), whatever the partition it came from, keyed or not (HugeCTR's messages carry no
Kafka key, so one key's updates may travel in several partitions; a topic's partition
count may change). The per-key read this needs is skipped for a row whose version is >= W
(its key's bucket's watermark).

**Why the shortcut is sound.** Invariant: *W[b] >= every version stored for a key of bucket
b* (in the tier that keeps them). Then a row with version v >= W has v >= W >= its key's
stored version, which is exactly what the per-key read would have checked: the row is
applied either way, so skipping the read changes nothing. Partitions play no part, so
neither unkeyed messages nor a change of partition count matter. The invariant holds:

1. *Established*: a table whose tier holds no W (a new table, or a database written before
   W) gets ``W = max`` of its stored versions, from one scan of them
   (:meth:`VersionedRows.scan`) when its :class:`VersionedRows` is built, before any update
   is applied; an empty table costs nothing, an old one a read of every row, once.
2. *Kept by every write*: :meth:`VersionedRows.write` raises W to the highest version it is
   about to store **before** it stores any of them, in the same tier. The tier keeps one
   writer's writes in order (RocksDB: one WAL, of which a crash keeps a prefix; Redis: one
   connection, each write acknowledged before the next is sent), so whatever survives a
   crash, a stored version never exceeds the stored W. W only ever rises, except by
   :meth:`VersionedRows.reset_above` (``hps repair-versions``), which lowers W to the
   highest version that remains after resetting every larger one.
3. *Read fresh*: W is read from the tier once per batch (:meth:`Watermarks.of`), never
   kept from an earlier batch, so another writer's raise (a partition's previous owner
   after a rebalance) is seen: its W write preceded its data, whose offsets were committed
   before the partition moved.

W is raised by a compare and set in the tier (:meth:`hps.tiers.rows.RowStore.insert_max`,
atomic in every L2 backend), so a writer whose reading of W is older than another writer's
raise never lowers it: the invariant holds with any number of writers. The rows are not
written so: several writers of one tier *at once* (several ``hps consume`` in one group over
a Redis-only tier, with unkeyed messages spreading a key over their partitions; or a
consumer still applying a batch of a partition it lost) race between a key's check and its
write, and the older row may win that one write. Keyed messages (``Publisher``) do not race
while each partition has one consumer.

Durability: :meth:`Watermarks.advance` ends each applied batch with a synced write of W,
which syncs every write before it; "durably applied" (and so the commit of its offsets)
means that sync returned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from hps.config.common import SIDE_TABLE_MARK
from hps.rowformat import Stored
from hps.tiers.rows import RowStore
from hps.tiers.side_tables import SideTable, Versions, from_limbs
from hps.tiers.watermarks import ALL_BUCKETS, BUCKETS, Watermarks, top_per_bucket
from hps.types import Keys, Mask, TableSpec

VERSION_SUFFIX = SIDE_TABLE_MARK + "version"


class VersionTable(SideTable):
    """Per-key versions of one table (0 means never updated)."""

    def __init__(self, store: RowStore, spec: TableSpec) -> None:
        super().__init__(store, spec, VERSION_SUFFIX)


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

    def scan(self) -> Iterator[tuple[Keys, Versions, Mask]]:
        """Every stored version, in chunks of ``(keys, versions, in_row)``: ``in_row`` where
        the version is carried by the data row, else it is a side-table entry."""
        for keys, limbs in self.store.dump(self.side.spec.name):
            yield keys, from_limbs(limbs), np.zeros(keys.size, dtype=bool)

    def reset(self, keys: Keys, in_row: Mask) -> None:
        """Set the stored versions of ``keys`` to 0 (``in_row``: the data row's)."""
        side = keys[~in_row]
        if side.size:
            self.side.put(side, np.zeros(side.size, dtype=np.uint64), durable=False)


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

    def scan(self) -> Iterator[tuple[Keys, Versions, Mask]]:
        yield from super().scan()
        for keys, _ in self.store.dump(self.name):
            versions, in_row = self.store.fetch_versions(self.name, keys)
            yield keys[in_row], np.asarray(versions[in_row], dtype=np.uint64), in_row[in_row]

    def reset(self, keys: Keys, in_row: Mask) -> None:
        super().reset(keys, in_row)
        rows = keys[in_row]
        if rows.size:  # rewritten as they are, with version 0
            values, found = self.store.fetch(self.name, rows)
            zeros = np.zeros(int(found.sum()), dtype=np.uint64)
            self.store.insert_versioned(self.name, rows[found], values[found], zeros)


def key_versions(store: RowStore, spec: TableSpec) -> SideVersions:
    """How ``store`` keeps the per-key versions of ``spec`` (see the module docstring)."""
    if store.versioned_rows:
        return RowVersions(store, spec)
    return SideVersions(store, spec)


class VersionedRows:
    """A table's rows and update versions over the tiers that take its updates.

    ``tiers[0]`` (L3 when it takes them) keeps the data with the per-key versions and the
    table's watermark; the others get the data only. The writes of one call go to
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
        self.watermarks = Watermarks(self.tiers[0], spec, self.highest_stored)
        # Established (a scan, once per database written before them) before any update is
        # applied, not inside the update loop, whose liveness a long scan would stall.
        self.watermarks.establish()

    def stored(self, keys: Keys) -> Versions:
        """The version of each key's last applied update (0: never updated)."""
        return self.versions.get(keys)

    def scan(self) -> Iterator[tuple[Keys, Versions, Mask]]:
        """Every stored version of the table (a full scan of its rows and side table)."""
        return self.versions.scan()

    def highest_stored(self) -> Versions:
        """The highest version stored for a key of each watermark bucket (0 for none): a scan."""
        top = np.zeros(BUCKETS, dtype=np.uint64)
        for keys, versions, _ in self.scan():
            np.maximum(top, top_per_bucket(keys, versions), out=top)
        return top

    def fast(self, keys: Keys, versions: Versions) -> npt.NDArray[np.bool_]:
        """Rows whose version is at least their bucket's watermark: newer than anything
        stored for their keys, so applied without a per-key read."""
        return np.asarray(versions, dtype=np.uint64) >= self.watermarks.of(keys)

    def reset_above(self, bound: int) -> int:
        """Reset every stored version above ``bound`` to 0 (keys pinned by a version from
        the future: their next update applies, whatever its version), then lower each
        bucket's watermark to the highest version left in it. Returns how many keys were
        reset.

        Meant for a stopped consumer (``hps repair-versions``; a running ``hps consume``
        holds L3's lock); the rows keep their values until the keys' next updates.
        """
        pinned: list[tuple[Keys, Mask]] = []
        top = np.zeros(BUCKETS, dtype=np.uint64)
        for keys, versions, in_row in self.scan():
            above = versions > np.uint64(bound)
            if above.any():
                pinned.append((keys[above], in_row[above]))
            np.maximum(top, top_per_bucket(keys[~above], versions[~above]), out=top)
        for keys, in_row in pinned:
            self.versions.reset(keys, in_row)
        self.watermarks.set(top)  # synced: the resets before it too
        if not pinned:
            return 0
        return int(np.unique(np.concatenate([k for k, _ in pinned])).size)

    def write(
        self,
        upserts: tuple[Keys, Stored, Versions],
        deletes: tuple[Keys, Versions],
        *,
        durable: bool,
        first_done: Callable[[], None] | None = None,
    ) -> None:
        """Upserted rows with their versions and deleted keys with theirs (tombstones) to the
        first tier (``durable``: synced), then the rows and the deletes to the others.

        The watermark is raised to cover the versions before any of them is stored.
        ``first_done`` is called between the first tier and the others (stage timing)."""
        up_keys, up_values, up_versions = upserts
        rm_keys, rm_versions = deletes
        self.watermarks.cover(
            np.concatenate([up_keys, rm_keys]).astype(np.int64),
            np.concatenate([up_versions, rm_versions]).astype(np.uint64),
        )
        if up_keys.size:
            self.versions.upsert(up_keys, up_values, up_versions, durable=durable)
        if rm_keys.size:
            self.versions.delete(rm_keys, rm_versions, durable=durable)
        if first_done is not None:
            first_done()
        for tier in self.tiers[1:]:
            if up_keys.size:
                tier.insert(self.spec.name, up_keys, up_values)
            if rm_keys.size:
                tier.remove(self.spec.name, rm_keys)


def last_version(store: RowStore, spec: TableSpec) -> int | None:
    """The highest update version applied to a table: its highest watermark (for a database
    written before the watermarks of key buckets, the highest of its partitions')."""
    marks = Watermarks(store, spec)
    w, found = marks.read(ALL_BUCKETS)
    if found.any():
        return int(w[found].max())
    top = [int(from_limbs(limbs).max()) for _, limbs in store.dump(marks.spec.name) if limbs.size]
    return max(top) if top else None
