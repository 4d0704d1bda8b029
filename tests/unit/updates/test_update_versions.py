"""Per-key order whatever the partition, and the watermarks that skip per-key reads
(hps/tiers/versions.py, docs/updates.md "Applying: order, idempotence, durability")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.errors import BackendError
from hps.storage.hash_map import HashMapStore
from hps.storage.rocks_db import RocksDBStore
from hps.tiers import Tiers
from hps.tiers.rows import RowStore
from hps.tiers.versions import VersionedRows, key_versions, last_version
from hps.tiers.watermarks import ALL_BUCKETS, BUCKETS, Watermarks, bucket_of
from hps.types import TableSpec, UpdateBatch
from hps.updates.applier import Applier
from hps.updates.partition import partition_of

SPEC = TableSpec("m", "t", 2)
KEYS = np.arange(1000, 1050, dtype=np.int64)  # 50 keys
NOW = 1_790_000_000_000_000_000


def batch(keys: np.ndarray, seed: float, version: int, partition: int) -> UpdateBatch:
    values = np.repeat((keys * 0.001 + seed)[:, None], SPEC.dim, axis=1).astype(np.float32)
    return UpdateBatch(SPEC.name, keys, values, version, extras={"partition": str(partition)})


def rocks(tmp_path: Path) -> RocksDBStore:
    return RocksDBStore(str(tmp_path / "l3"))


class CountingStore(HashMapStore):
    """Counts per-key version reads (the side table) and can fail the data writes."""

    def __init__(self) -> None:
        super().__init__()
        self.version_reads = 0
        self.fail_data = False

    def fetch(self, table: str, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if table.endswith("__hps_version"):
            self.version_reads += int(keys.size)
        return super().fetch(table, keys)

    def insert(self, table: str, keys: np.ndarray, values: np.ndarray, **kw: bool) -> None:
        if self.fail_data and table == SPEC.name:
            raise BackendError("disk full")
        super().insert(table, keys, values, **kw)


def stored_values(store: HashMapStore | RocksDBStore, keys: np.ndarray) -> np.ndarray:
    values, found = store.fetch(SPEC.name, keys)
    assert found.all()
    return np.asarray(values[:, 0], dtype=np.float64)


@pytest.mark.parametrize("l3_kind", ["hash_map", "rocks_db"])
def test_an_older_row_on_another_partition_never_replaces_a_newer_one(
    tmp_path: Path, l3_kind: str
) -> None:
    """HugeCTR messages have no key: an update 60 s newer on partition 0, then one 1 s old
    on partition 1 (the issue's case, 50 keys) keeps the newer row."""
    l2 = HashMapStore()
    l3 = rocks(tmp_path) if l3_kind == "rocks_db" else HashMapStore()
    applier = Applier({SPEC.name: SPEC}, Tiers(l2, l3))
    applier.apply([batch(KEYS, 0.5, NOW + 60 * 10**9, 0)])
    (applied,) = applier.apply([batch(KEYS, 0.9, NOW - 10**9, 1)])
    assert applied.stale == KEYS.size and applied.keys.size == 0
    for store in (l2, l3):
        np.testing.assert_allclose(stored_values(store, KEYS), KEYS * 0.001 + 0.5, rtol=1e-6)
    l3.close()


def test_a_partition_count_change_keeps_order() -> None:
    """Keys published over 2 partitions, then over 8: the newer rows (read first, from the
    new partitions) stay when the older ones of the old partitions arrive."""
    l3 = HashMapStore()
    applier = Applier({SPEC.name: SPEC}, Tiers(HashMapStore(), l3))
    cand = np.arange(5000, 5400, dtype=np.int64)
    keys = cand[partition_of(cand, 8) >= 2][:50]  # moved to partitions 2-7
    new_parts, old_parts = partition_of(keys, 8), partition_of(keys, 2)
    for p in np.unique(new_parts):
        applier.apply([batch(keys[new_parts == p], 0.5, NOW + 2, int(p))])
    for p in np.unique(old_parts):
        (applied,) = applier.apply([batch(keys[old_parts == p], 0.9, NOW + 1, int(p))])
        assert applied.keys.size == 0
    np.testing.assert_allclose(stored_values(l3, keys), keys * 0.001 + 0.5, rtol=1e-6)


def test_rows_without_a_partition_keep_order_too() -> None:
    l3 = HashMapStore()
    applier = Applier({SPEC.name: SPEC}, Tiers(HashMapStore(), l3))
    newer = UpdateBatch(SPEC.name, KEYS, np.ones((KEYS.size, 2), np.float32), 20)
    older = UpdateBatch(SPEC.name, KEYS, np.zeros((KEYS.size, 2), np.float32), 10)
    applier.apply([newer])
    (applied,) = applier.apply([older])
    assert applied.stale == KEYS.size
    np.testing.assert_array_equal(stored_values(l3, KEYS), np.ones(KEYS.size))


def test_an_in_order_keyed_stream_reads_no_versions_whatever_the_partition_interleaving() -> None:
    """Publisher's partitioning (splitmix64 % 8) puts a bucket's keys in one partition: its
    versions arrive in order however the consumer interleaves partitions, so the watermarks
    answer for every row (the fast path the bench relies on)."""
    l3 = CountingStore()
    applier = Applier({SPEC.name: SPEC}, Tiers(HashMapStore(), l3))
    rng = np.random.default_rng(3)
    publishes = [
        (rng.choice(100_000, 400, replace=False).astype(np.int64), NOW + i) for i in range(12)
    ]
    parts_of = [partition_of(keys, 8) for keys, _ in publishes]
    # the consumer reads partition 7's messages of every publish first, then partition 6's...
    for p in range(7, -1, -1):
        applier.apply(
            [
                batch(keys[parts == p], i, version, p)
                for i, ((keys, version), parts) in enumerate(zip(publishes, parts_of, strict=True))
            ]
        )
    assert l3.version_reads == 0
    last = {int(k): i for i, (keys, _) in enumerate(publishes) for k in keys}
    keys = np.array(sorted(last), dtype=np.int64)
    want = keys * 0.001 + np.array([last[int(k)] for k in keys])
    np.testing.assert_allclose(stored_values(l3, keys), want, rtol=1e-6)


def test_unkeyed_rows_below_a_bucket_watermark_are_checked_key_by_key() -> None:
    l3 = CountingStore()
    applier = Applier({SPEC.name: SPEC}, Tiers(HashMapStore(), l3))
    applier.apply([batch(KEYS[:10], 0.5, 100, 0)])
    same_buckets = KEYS[10:][np.isin(bucket_of(KEYS[10:]), bucket_of(KEYS[:10]))]
    applier.apply([batch(np.concatenate([KEYS[:10], same_buckets]), 0.9, 50, 1)])
    # every row was below its bucket's watermark; only KEYS[:10] held a newer version
    assert l3.version_reads == 10 + same_buckets.size


def test_the_watermark_is_raised_before_the_data_so_a_failed_write_keeps_the_invariant() -> None:
    l3 = CountingStore()
    route = VersionedRows(SPEC, [RowStore(l3, "L3")])
    keys = KEYS[:5]
    values = np.ones((5, 2), np.float32)
    l3.fail_data = True
    no_deletes = (keys[:0], np.zeros(0, np.uint64))
    with pytest.raises(BackendError):
        route.write((keys, values, np.full(5, 77, np.uint64)), no_deletes, durable=False)
    marks = Watermarks(RowStore(l3, "L3"), SPEC)
    w, found = marks.read(bucket_of(keys))
    assert found.all() and (w >= 77).all()
    l3.fail_data = False
    route.write((keys, values, np.full(5, 77, np.uint64)), no_deletes, durable=True)
    assert (route.stored(keys) <= route.watermarks.of(keys)).all()


def test_a_writer_that_read_the_watermarks_earlier_never_lowers_them() -> None:
    """Two consumers of one shared tier: the second raises W after the first read it; the
    first's later, lower raise keeps the second's, so an older row still gets its key's
    check (the second's row at 20 is not replaced by a 17)."""
    shared = HashMapStore()
    first, second = (VersionedRows(SPEC, [RowStore(shared, "L2")]) for _ in range(2))
    candidates = np.arange(1000, 5000, dtype=np.int64)
    key, other = candidates[bucket_of(candidates) == bucket_of(candidates[:1])[0]][:2, None]
    first.fast(key, np.array([1], np.uint64))  # reads W (none yet: 0) for its batch
    second.write((key, np.full((1, 2), 2.0, np.float32), np.array([20], np.uint64)),
                 (key[:0], np.zeros(0, np.uint64)), durable=False)  # fmt: skip
    first.watermarks.cover(other, np.array([15], np.uint64))  # it read W = 0: 15 raises it
    assert first.watermarks.of(key).tolist() == [20]
    assert not first.fast(key, np.array([17], np.uint64)).any()  # 17 < W: read key by key
    assert first.stored(key).tolist() == [20]


def old_database(tmp_path: Path, pinned_version: int) -> RocksDBStore:
    """An L3 as a consumer before the bucket watermarks left it: rows carrying versions
    (keys 0-49: KEYS[:25] pinned far in the future), a tombstone, no watermark."""
    l3 = rocks(tmp_path)
    tier = RowStore(l3, "L3")
    tier.open_table(SPEC)
    versions = key_versions(tier, SPEC)
    v = np.full(KEYS.size, NOW, dtype=np.uint64)
    v[:25] = pinned_version
    versions.upsert(KEYS, np.zeros((KEYS.size, 2), np.float32), v, durable=True)
    versions.delete(np.array([7], np.int64), np.array([NOW + 5], np.uint64), durable=True)
    return l3


def test_an_old_database_gets_its_watermarks_from_a_scan(tmp_path: Path) -> None:
    l3 = old_database(tmp_path, NOW + 10)
    tier = RowStore(l3, "L3")
    assert not Watermarks(tier, SPEC).read(ALL_BUCKETS)[1].any()
    applier = Applier({SPEC.name: SPEC}, Tiers(None, l3))
    w, found = Watermarks(tier, SPEC).read(ALL_BUCKETS)
    assert found.all()
    assert int(w.max()) == NOW + 10 and w[bucket_of(np.array([7]))[0]] >= NOW + 5
    # an update older than the stored rows (on any partition) changes nothing
    (applied,) = applier.apply([batch(KEYS, 0.9, NOW - 1, 3)])
    assert applied.stale == KEYS.size
    (applied,) = applier.apply([batch(np.array([7], np.int64), 0.9, NOW + 1, 3)])
    assert applied.stale == 1  # the tombstone is newer
    l3.close()


def test_reset_above_unpins_only_the_keys_from_the_future(tmp_path: Path) -> None:
    far = NOW + 50 * 365 * 86400 * 10**9
    l3 = old_database(tmp_path, far)
    tier = RowStore(l3, "L3")
    side = VersionedRows(SPEC, [tier])
    side.versions.delete(np.array([5000], np.int64), np.array([far], np.uint64), durable=True)
    assert last_version(tier, SPEC) == far
    assert side.reset_above(NOW + 300 * 10**9) == 26  # 25 rows + 1 tombstone
    assert last_version(tier, SPEC) == NOW + 5
    assert side.reset_above(NOW + 300 * 10**9) == 0
    applier = Applier({SPEC.name: SPEC}, Tiers(None, l3))
    # an honest update a little older than the unpinned rows: only the unpinned keys take it
    (applied,) = applier.apply([batch(KEYS, 0.5, NOW - 1, 0)])
    assert sorted(applied.keys.tolist()) == KEYS[:25].tolist() and applied.stale == 25
    np.testing.assert_allclose(stored_values(l3, KEYS[:25]), KEYS[:25] * 0.001 + 0.5, rtol=1e-6)
    l3.close()


def test_buckets_divide_by_common_partition_counts() -> None:
    keys = np.arange(-5000, 5000, dtype=np.int64)
    for count in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64):
        assert BUCKETS % count == 0
        np.testing.assert_array_equal(bucket_of(keys) % count, partition_of(keys, count))
