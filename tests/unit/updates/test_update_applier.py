"""The applier: versions decide, replays change nothing, deletes leave tombstones."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from hps.dedup import in_stored_order
from hps.errors import BackendError, UnknownTableError
from hps.storage.hash_map import HashMapStore
from hps.tiers import Tiers
from hps.types import TableSpec, UpdateBatch
from hps.updates.applier import Applied, Applier, _latest_per_key, model_filter

SPEC = TableSpec("m", "t", 3)
OTHER = TableSpec("skip_me", "t", 2)


def vec(keys: list[int], seed: float) -> np.ndarray:
    return np.array([[k + seed] * 3 for k in keys], dtype=np.float32)


def up(keys: list[int], seed: float, version: int) -> UpdateBatch:
    return UpdateBatch(SPEC.name, np.array(keys, np.int64), vec(keys, seed), version)


def rm(keys: list[int], version: int) -> UpdateBatch:
    return UpdateBatch(SPEC.name, np.array(keys, np.int64), None, version, delete=True)


@pytest.fixture
def stores() -> tuple[HashMapStore, HashMapStore]:
    return HashMapStore(), HashMapStore()


def make(stores: tuple[HashMapStore, HashMapStore], **kw: object) -> Applier:
    l2, l3 = stores
    return Applier({SPEC.name: SPEC}, Tiers(l2, l3), **kw)  # type: ignore[arg-type]


def state(store: HashMapStore, keys: list[int]) -> tuple[np.ndarray, np.ndarray]:
    return store.fetch(SPEC.name, np.array(keys, np.int64))


def test_upserts_reach_both_tiers(stores: tuple[HashMapStore, HashMapStore]) -> None:
    make(stores).apply([up([1, 2], 0.5, 10)])
    for store in stores:
        values, found = state(store, [1, 2, 3])
        assert found.tolist() == [True, True, False]
        np.testing.assert_array_equal(values[:2], vec([1, 2], 0.5))


def test_older_version_never_overwrites(stores: tuple[HashMapStore, HashMapStore]) -> None:
    a = make(stores)
    a.apply([up([1, 2], 0.5, 20)])
    (applied,) = a.apply([up([1, 3], 0.9, 10)])
    assert applied.stale == 1 and applied.keys.tolist() == [3]
    values, _ = state(stores[1], [1, 3])
    np.testing.assert_array_equal(values, np.concatenate([vec([1], 0.5), vec([3], 0.9)]))


def test_replay_changes_nothing(stores: tuple[HashMapStore, HashMapStore]) -> None:
    stream = [up([1, 2, 3], 0.1, 1), up([2], 0.2, 2), rm([3], 3), up([1], 0.3, 4)]
    a = make(stores)
    for b in stream:
        a.apply([b])
    before = [state(s, [1, 2, 3]) for s in stores]
    # A crash after the 2nd message: everything from there is delivered again, in one batch.
    a.apply(stream[1:])
    a.apply(stream)  # and a full replay
    for store, (values, found) in zip(stores, before, strict=True):
        v2, f2 = state(store, [1, 2, 3])
        assert f2.tolist() == found.tolist() == [True, True, False]
        np.testing.assert_array_equal(v2[:2], values[:2])
    np.testing.assert_array_equal(before[0][0][:2], np.concatenate([vec([1], 0.3), vec([2], 0.2)]))


def test_delete_tombstone_blocks_an_older_upsert(stores: tuple[HashMapStore, HashMapStore]) -> None:
    a = make(stores)
    a.apply([up([5], 0.5, 1)])
    a.apply([rm([5], 5)])
    (applied,) = a.apply([up([5], 0.7, 4)])
    assert applied.stale == 1
    assert not state(stores[0], [5])[1].any() and not state(stores[1], [5])[1].any()
    a.apply([up([5], 0.8, 6)])  # a newer upsert brings it back
    np.testing.assert_array_equal(state(stores[1], [5])[0], vec([5], 0.8))


def test_within_a_batch_the_latest_row_of_a_key_wins(
    stores: tuple[HashMapStore, HashMapStore],
) -> None:
    batch = UpdateBatch(
        SPEC.name,
        np.array([7, 8, 7], np.int64),
        np.concatenate([vec([7], 1), vec([8], 1), vec([7], 2)]),
        3,
    )
    (applied,) = make(stores).apply([up([7], 9, 4), batch, up([8], 5, 3)])
    np.testing.assert_array_equal(
        state(stores[0], [7, 8])[0], np.concatenate([vec([7], 9), vec([8], 5)])
    )
    assert applied.keys.tolist() == [7, 8]  # unique


def test_rows_come_in_the_stored_key_order(stores: tuple[HashMapStore, HashMapStore]) -> None:
    """Ordered as RocksDB keeps the keys' little-endian bytes, so L3 writes them unsorted."""
    (applied,) = make(stores).apply([up([-1, 1, 256], 1, 2), up([1, 2**40], 2, 3)])
    assert applied.keys.tolist() == [2**40, 256, 1, -1]
    rows = [vec([2**40], 2), vec([256], 1), vec([1], 2), vec([-1], 1)]
    np.testing.assert_array_equal(applied.values, np.concatenate(rows))


@pytest.mark.parametrize("seed", range(5))
def test_each_key_keeps_its_highest_version_and_the_latest_row_among_equals(seed: int) -> None:
    """Against the rule row by row, with keys repeated within and across messages."""
    rng = np.random.default_rng(seed)
    group = []
    for i in range(int(rng.integers(1, 12))):
        n = int(rng.integers(1, 40))
        keys = rng.integers(-20, 20, n).astype(np.int64)  # repeats within a message too
        delete = bool(rng.random() < 0.2)
        values = None if delete else rng.standard_normal((n, 3)).astype(np.float32)
        extras = {"partition": str(i % 3)}
        group.append(UpdateBatch(SPEC.name, keys, values, int(rng.integers(1, 5)), delete, extras))
    want: dict[int, tuple[int, bool, np.ndarray, int]] = {}
    for b in group:  # stream order: a later row of equal version wins
        for j, k in enumerate(b.keys.tolist()):
            row = np.zeros(3, np.float32) if b.values is None else b.values[j]
            if k not in want or b.version >= want[k][0]:
                want[k] = (b.version, b.delete, row, int(b.extras["partition"]))
    keys, versions, deletes, values, parts = _latest_per_key(group, 3)
    assert in_stored_order(keys) and sorted(keys.tolist()) == sorted(want)
    for i, k in enumerate(keys.tolist()):
        version, delete, row, part = want[k]
        assert (versions[i], deletes[i], parts[i]) == (version, delete, part)
        np.testing.assert_array_equal(values[i], row)


def test_listeners_see_what_was_applied(stores: tuple[HashMapStore, HashMapStore]) -> None:
    """Once per apply, every table's part, with the publish timestamps of its messages."""
    seen: list[Sequence[Applied]] = []
    first = up([1, 2], 0, 2)
    first.extras["published_ns"] = "111"
    make(stores, listeners=[seen.append]).apply([first, rm([2], 3)])
    ((applied,),) = seen
    assert applied.keys.tolist() == [1] and applied.deleted.tolist() == [2]
    assert applied.published_ns == (111,)


def test_a_failing_listener_does_not_fail_the_batch(
    stores: tuple[HashMapStore, HashMapStore],
) -> None:
    def boom(_: Sequence[Applied]) -> None:
        raise RuntimeError("L1 gone")

    make(stores, listeners=[boom]).apply([up([1], 0, 1)])
    assert state(stores[1], [1])[1].all()


def test_a_listener_backend_error_fails_the_batch(
    stores: tuple[HashMapStore, HashMapStore],
) -> None:
    """A listener that could not pass the batch on (the node's journal) has it applied again."""

    def full(_: Sequence[Applied]) -> None:
        raise BackendError("change journal: no space left")

    with pytest.raises(BackendError, match="no space"):
        make(stores, listeners=[full]).apply([up([1], 0, 1)])


def test_filters_route_models_to_tiers() -> None:
    l2, l3 = HashMapStore(), HashMapStore()
    tables = {SPEC.name: SPEC, OTHER.name: OTHER}
    a = Applier(
        tables,
        Tiers(l2, l3),
        persistent_models=model_filter(["^m$"]),
        volatile_models=model_filter(["^nothing$"]),
    )
    assert set(a.tables) == {SPEC.name}
    a.apply([up([1], 0, 1)])
    assert l3.fetch(SPEC.name, np.array([1]))[1].all()
    l2.open_table(SPEC)  # the applier never opened it there
    assert not l2.fetch(SPEC.name, np.array([1]))[1].any()
    with pytest.raises(UnknownTableError):
        a.apply([UpdateBatch(OTHER.name, np.array([1]), np.ones((1, 2), np.float32), 1)])


def test_default_filter_matches_every_model() -> None:
    f = model_filter([".+"])
    assert f("demo") and f("hps_x") and not model_filter(["^hps_.+$"])("demo")


class CountingStore(HashMapStore):
    def __init__(self) -> None:
        super().__init__()
        self.version_reads = 0

    def fetch(self, table: str, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if table.endswith("__hps_version"):
            self.version_reads += int(keys.size)
        return super().fetch(table, keys)


def in_part(batch: UpdateBatch, partition: int) -> UpdateBatch:
    return UpdateBatch(
        batch.table,
        batch.keys,
        batch.values,
        batch.version,
        batch.delete,
        {"partition": str(partition)},
    )


def test_in_order_partitions_need_no_version_reads() -> None:
    l3 = CountingStore()
    a = Applier({SPEC.name: SPEC}, Tiers(HashMapStore(), l3))
    a.apply([in_part(up([1, 2], 0.1, 10), 0), in_part(up([3], 0.1, 5), 1)])
    a.apply([in_part(up([1], 0.2, 11), 0), in_part(rm([3], 6), 1)])
    assert l3.version_reads == 0
    # A replay of partition 0 from the start: key 1 is below its bucket's watermark (11), so
    # it is checked; key 2 is at its bucket's (10) and is rewritten as it was.
    (applied,) = a.apply([in_part(up([1, 2], 0.1, 10), 0)])
    assert l3.version_reads == 1 and applied.stale == 1  # key 1 has version 11
    values, found = l3.fetch(SPEC.name, np.array([1, 2, 3]))
    assert found.tolist() == [True, True, False]
    np.testing.assert_array_equal(values[:2], np.concatenate([vec([1], 0.2), vec([2], 0.1)]))


def test_watermarks_survive_a_new_applier() -> None:
    l2, l3 = HashMapStore(), CountingStore()
    Applier({SPEC.name: SPEC}, Tiers(l2, l3)).apply([in_part(up([1], 0, 50), 3)])
    restarted = Applier({SPEC.name: SPEC}, Tiers(l2, l3))
    (applied,) = restarted.apply([in_part(up([1], 9, 40), 3)])  # a replayed older message
    assert applied.stale == 1 and l3.version_reads == 1
    np.testing.assert_array_equal(l3.fetch(SPEC.name, np.array([1]))[0], vec([1], 0))


@pytest.mark.parametrize("row_dtype", ["float16", "int8"])
def test_updates_are_stored_in_the_table_format(row_dtype: str) -> None:
    """The wire stays float32; the applier encodes once, for every tier and the listeners."""
    spec = TableSpec("m", "q", 3, row_dtype=row_dtype)  # type: ignore[arg-type]
    l2, l3 = HashMapStore(), HashMapStore()
    heard: list[Applied] = []
    applier = Applier({spec.name: spec}, Tiers(l2, l3), listeners=[heard.extend])
    keys = np.array([4, 1, 4], np.int64)
    values = np.array([[1, 2, 3], [-1, 0, 9], [5, 6, 7.5]], np.float32)
    applier.apply([UpdateBatch(spec.name, keys[:2], values[:2], 1)])
    applier.apply([UpdateBatch(spec.name, keys[2:], values[2:], 2)])
    want = spec.fmt.encode(values[[1, 2]])  # keys 1, 4: the latest row of 4
    for store in (l2, l3):
        got, found = store.fetch(spec.name, np.array([1, 4], np.int64))
        assert found.all() and got.dtype == spec.fmt.dtype
        np.testing.assert_array_equal(got, want)
    assert heard[-1].values.dtype == spec.fmt.dtype
    np.testing.assert_array_equal(heard[-1].values, spec.fmt.encode(values[2:]))


class SyncLog(HashMapStore):
    """Logs every write of the table's rows and every synced write, in order."""

    def __init__(self, log: list[str], fail_sync: bool = False) -> None:
        super().__init__()
        self.log, self.fail_sync = log, fail_sync

    def insert(
        self, table: str, keys: np.ndarray, values: np.ndarray, *, durable: bool = False
    ) -> None:
        if durable:
            self.log.append("sync")
            if self.fail_sync:
                raise BackendError("disk full")
        elif table == SPEC.name:
            self.log.append("write")
        super().insert(table, keys, values, durable=durable)


def test_rows_are_served_before_the_batch_is_synced() -> None:
    """L1 and the freshness record see the rows once the tiers hold them; the synced watermark
    write comes last, and a failed sync raises (the batch is applied again, nothing lost)."""
    log: list[str] = []
    a = Applier(
        {SPEC.name: SPEC},
        Tiers(HashMapStore(), SyncLog(log)),
        listeners=[lambda applied: log.append("listener")],
    )
    a.apply([in_part(up([9], 0.5, 1), 0)])  # the table's first batch also sets it up
    log.clear()
    a.apply([in_part(up([1, 2], 0.5, 10), 0)], served=lambda: log.append("served"))
    assert log == ["write", "listener", "served", "sync"]

    failing = Applier(
        {SPEC.name: SPEC},
        Tiers(HashMapStore(), store := SyncLog(log)),
        listeners=[lambda applied: log.append("listener")],
    )
    failing.apply([in_part(up([9], 0.5, 1), 0)])
    log.clear()
    store.fail_sync = True
    with pytest.raises(BackendError):
        failing.apply([in_part(up([3], 0.5, 10), 0)], served=lambda: log.append("served"))
    assert log == ["write", "listener", "served", "sync"]
