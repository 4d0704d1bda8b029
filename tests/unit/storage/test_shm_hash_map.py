"""SharedHashMapStore in one process: its structure against a dict model, eviction, lifecycle.

The multi-process behaviour (locks, crashes, sharing) is in
tests/integration/storage/test_multi_process_hash_map.py.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from hps.config import VolatileDBConfig
from hps.errors import BackendError, ConfigError, InvalidValueError
from hps.index import EMPTY, TOMBSTONE, TOMBSTONE_ROOM
from hps.storage import open_store
from hps.storage._shm_index import MAX_LOAD, BucketIndex, bucket_slots
from hps.storage._shm_layout import MAX_TABLES, EntryWord, HeaderWord, NoSpace
from hps.storage.multi_process_hash_map import SharedHashMapStore
from hps.types import TableSpec
from hps.validate import as_rows
from tests.helpers import rows, unique_name

MiB = 1024 * 1024
Opener = Callable[..., SharedHashMapStore]


@pytest.fixture
def opener() -> Iterator[Opener]:
    """Open stores on one fresh segment name; closes them and checks the files are gone."""
    name = unique_name("hps_test_shm")
    opened: list[SharedHashMapStore] = []

    def open_(size: int = 8 * MiB, **kw: Any) -> SharedHashMapStore:
        kw.setdefault("seed", 0)
        s = SharedHashMapStore(name, size, **kw)
        opened.append(s)
        return s

    yield open_
    for s in opened:
        s.close()
    for suffix in ("", ".lock", ".users", ".turn"):
        path = f"/dev/shm/{name}{suffix}"
        if os.path.exists(path):
            os.unlink(path)
            pytest.fail(f"{path} was left behind")


def _extents_accounted(store: SharedHashMapStore) -> None:
    st = store.stats()
    used = sum(t["extents"] for t in st["tables"].values())
    assert used + st["free_extents"] == st["extents"], st


def _encode(keys: np.ndarray, step: int) -> np.ndarray:
    """Rows that name their key (40 bits in two exact float32 columns) and the step."""
    k = keys.astype(np.int64) + 2**40
    return np.stack([k & 0xFFFFF, k >> 20, np.full(k.size, step)], axis=1).astype(np.float32)


def test_matches_a_dict_through_splits_removals_and_compaction(opener: Opener) -> None:
    store = opener(16 * MiB)
    spec = TableSpec("m", "t", 3)
    store.open_table(spec)
    rng = np.random.default_rng(1)
    model: dict[int, int] = {}  # key -> step of its last write

    def check(probe: np.ndarray) -> None:
        got, found = store.fetch(spec.name, probe)
        expect = np.array([k in model for k in probe.tolist()])
        np.testing.assert_array_equal(found, expect)
        steps = np.array([model[k] for k in probe[found].tolist()], dtype=np.int64)
        want = _encode(probe[found], 0)
        want[:, 2] = steps
        np.testing.assert_array_equal(got[found], want)

    for step in range(40):
        if step % 3:
            keys = rng.integers(-(2**40), 2**40, 4000)
        else:
            keys = rng.choice(np.array(list(model) or [1], dtype=np.int64), 500)
        if step % 4 == 3:
            store.remove(spec.name, keys)
            for k in keys.tolist():
                model.pop(k, None)
        else:
            store.insert(spec.name, keys, _encode(keys, step))
            model.update(dict.fromkeys(keys.tolist(), step))
        sample = rng.choice(np.array(list(model), dtype=np.int64), 1000)
        check(np.concatenate([sample, keys, [EMPTY, TOMBSTONE]]))
        assert store.size(spec.name) == len(model)
    check(np.array(list(model), dtype=np.int64))
    _extents_accounted(store)
    assert store.stats()["tables"][spec.name]["extents"] > 10  # buckets split, rows spread
    store.remove(spec.name, np.array(list(model), dtype=np.int64))
    assert store.size(spec.name) == 0
    assert store.stats()["free_extents"] == store.stats()["extents"]  # all given back


def test_tombstones_are_recycled_without_growth(opener: Opener) -> None:
    store = opener(4 * MiB)
    spec = TableSpec("m", "t", 2)
    store.open_table(spec)
    for i in range(30):
        keys = np.arange(i * 3000, i * 3000 + 3000, dtype=np.int64)
        store.insert(spec.name, keys, rows(keys, 2))
        store.remove(spec.name, keys[:2900])
    assert store.size(spec.name) == 30 * 100
    got, found = store.fetch(spec.name, np.arange(0, 90_000, dtype=np.int64))
    assert found.sum() == 3000
    _extents_accounted(store)


def test_a_near_full_bucket_under_churn_is_not_rebuilt_on_every_insert(
    opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = opener(4 * MiB)
    spec = TableSpec("m", "t", 2)
    store.open_table(spec)
    slots = bucket_slots(store._seg.extent)
    capacity = int(slots * MAX_LOAD)
    keys = np.arange(capacity - 1, dtype=np.int64)  # one bucket, one key short of a split
    store.insert(spec.name, keys, rows(keys, 2))
    rebuilt: list[int] = []
    rebuild = BucketIndex._rebuild
    monkeypatch.setattr(
        BucketIndex, "_rebuild", lambda self, b: (rebuilt.append(b), rebuild(self, b))[1]
    )
    for step in range(200):  # a key out, a new one in: every removal leaves a tombstone
        store.remove(spec.name, keys[step : step + 1])
        new = np.array([10**9 + step], dtype=np.int64)
        store.insert(spec.name, new, rows(new, 2))
    room = int(TOMBSTONE_ROOM * (slots - capacity))
    assert len(rebuilt) <= 200 // room  # it was every insert once tombstones filled the room
    assert store.size(spec.name) == capacity - 1 and store.stats()["tables"]
    got, found = store.fetch(spec.name, np.arange(10**9, 10**9 + 200, dtype=np.int64))
    assert found.all()
    _extents_accounted(store)


def test_a_shrunk_table_gives_back_its_buckets_and_keeps_its_rows(opener: Opener) -> None:
    store = opener(16 * MiB)
    spec = TableSpec("m", "t", 2)
    store.open_table(spec)
    keys = np.arange(200_000, dtype=np.int64)
    store.insert(spec.name, keys, rows(keys, 2))
    buckets = store._table(spec.name).meta[EntryWord.N_BUCKETS]
    store.remove(spec.name, keys[: keys.size - 5000])
    left = keys[-5000:]
    assert store._table(spec.name).meta[EntryWord.N_BUCKETS] * 10 < buckets
    got, found = store.fetch(spec.name, keys)
    assert found.sum() == left.size and found[-5000:].all()
    np.testing.assert_array_equal(got[found], rows(left, 2))
    _extents_accounted(store)
    more = np.arange(10**9, 10**9 + 50_000, dtype=np.int64)  # it grows again as before
    store.insert(spec.name, more, rows(more, 2))
    got, found = store.fetch(spec.name, np.concatenate([left, more]))
    assert found.all() and store.size(spec.name) == left.size + more.size
    _extents_accounted(store)


def test_a_shrunk_table_is_not_the_one_a_full_segment_evicts_from(opener: Opener) -> None:
    store = opener(4 * MiB, overflow_policy="evict_oldest")
    a, b = TableSpec("m", "a", 2), TableSpec("m", "b", 2)
    store.open_table(a)
    store.open_table(b)
    keys = np.arange(70_000, dtype=np.int64)  # more of the segment in buckets than in rows
    for part in np.split(keys, 7):
        store.insert(a.name, part, rows(part, 2))
    kept = keys[:2000]
    store.remove(a.name, keys[2000:])
    for i in range(40):  # b fills the segment: its own oldest rows make room
        more = np.arange(10**9 + i * 10_000, 10**9 + (i + 1) * 10_000, dtype=np.int64)
        store.insert(b.name, more, rows(more, 2))
    got, found = store.fetch(a.name, kept)
    assert found.all()
    np.testing.assert_array_equal(got, rows(kept, 2))
    _extents_accounted(store)


def test_a_rebuild_that_runs_out_of_extents_empties_the_table(
    opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = opener(16 * MiB)
    spec = TableSpec("m", "t", 2)
    store.open_table(spec)
    keys = np.arange(100_000, dtype=np.int64)
    store.insert(spec.name, keys, rows(keys, 2))

    def no_room(self: BucketIndex, keys: np.ndarray, rows: np.ndarray) -> None:
        raise NoSpace("no extent free")

    monkeypatch.setattr(BucketIndex, "insert", no_room)
    store.remove(spec.name, keys[5000:])
    assert store.size(spec.name) == 0
    assert not store.fetch(spec.name, keys[:5000])[1].any()
    assert store.stats()["free_extents"] == store.stats()["extents"]


def test_reserved_keys(opener: Opener) -> None:
    store = opener()
    spec = TableSpec("m", "t", 2)
    store.open_table(spec)
    with pytest.raises(InvalidValueError, match="reserved"):  # refused at the boundary
        as_rows(spec, np.array([1, EMPTY]), np.zeros((2, 2), np.float32))
    store.insert(spec.name, np.array([5]), np.ones((1, 2), np.float32))
    store.remove(spec.name, np.array([EMPTY, TOMBSTONE]))
    _, found = store.fetch(spec.name, np.array([EMPTY, TOMBSTONE, 5]))
    assert found.tolist() == [False, False, True]
    assert store.size(spec.name) == 1


def test_full_segment_evicts_and_keeps_the_newest_batch(opener: Opener) -> None:
    store = opener(2 * MiB, overflow_policy="evict_oldest")
    a, b = TableSpec("m", "a", 32), TableSpec("m", "b", 32)
    store.open_table(a)
    store.open_table(b)
    for i in range(12):
        keys = np.arange(i * 2000, (i + 1) * 2000, dtype=np.int64)
        store.insert(a.name if i < 8 else b.name, keys, rows(keys, 32))
        _, found = store.fetch(a.name if i < 8 else b.name, keys)
        assert found.all()
    total = store.size(a.name) + store.size(b.name)
    assert 0 < total < 12 * 2000
    _, found = store.fetch(a.name, np.arange(0, 2000, dtype=np.int64))
    assert not found.any()  # the oldest rows went first
    _extents_accounted(store)


def test_a_batch_that_can_never_fit_changes_nothing(opener: Opener) -> None:
    store = opener(1 * MiB)
    spec = TableSpec("m", "t", 64)
    store.open_table(spec)
    keys = np.arange(100, dtype=np.int64)
    store.insert(spec.name, keys, rows(keys, 64))
    big = np.arange(1000, 200_000, dtype=np.int64)
    with pytest.raises(BackendError, match="shared_memory_size"):
        store.insert(spec.name, big, np.zeros((big.size, 64), np.float32))
    got, found = store.fetch(spec.name, keys)
    assert found.all()
    np.testing.assert_array_equal(got, rows(keys, 64))


@pytest.mark.parametrize("policy", ["evict_oldest", "evict_least_used", "evict_random"])
def test_overflow_margin(opener: Opener, policy: str) -> None:
    store = opener(overflow_margin=1000, overflow_policy=policy, overflow_resolution_target=0.5)
    spec = TableSpec("m", "t", 4)
    store.open_table(spec)
    first = np.arange(0, 600, dtype=np.int64)
    second = np.arange(600, 1000, dtype=np.int64)
    store.insert(spec.name, first, rows(first, 4))
    store.insert(spec.name, second, rows(second, 4))
    store.fetch(spec.name, first[:100])  # recently used
    third = np.arange(1000, 1100, dtype=np.int64)
    store.insert(spec.name, third, rows(third, 4))
    assert store.size(spec.name) == 500
    _, f_first = store.fetch(spec.name, first[:100])
    _, f_third = store.fetch(spec.name, third)
    if policy == "evict_oldest":
        assert not f_first.any() and f_third.all()
    elif policy == "evict_least_used":
        assert f_first.all() and f_third.all()
    everything = np.arange(0, 1100, dtype=np.int64)
    got, found = store.fetch(spec.name, everything)
    assert found.sum() == 500
    np.testing.assert_array_equal(got[found], rows(everything[found], 4))


def test_tables_registry_is_shared_and_checked(opener: Opener) -> None:
    one, two = opener(), opener()
    one.open_table(TableSpec("m", "a", 4))
    one.open_table(TableSpec("m", "b", 2))
    two.open_table(TableSpec("m", "b", 2))  # another order, same entry
    keys = np.arange(10, dtype=np.int64)
    one.insert("m.b", keys, rows(keys, 2))
    got, found = two.fetch("m.b", keys)
    assert found.all()
    np.testing.assert_array_equal(got, rows(keys, 2))
    with pytest.raises(ConfigError, match="dimension 4"):
        two.open_table(TableSpec("m", "a", 8))
    assert one.stats()["attached"] == 2


def test_a_table_another_store_dropped_is_opened_again_never_misread(opener: Opener) -> None:
    """Another process's ``import --force`` or retire drops a table this store holds open:
    its entry may then hold another table (the lowest free entry is taken first). The
    handle sees that under the lock and opens the table again: what the entry holds now is
    never read (nor overwritten) as this table's rows."""
    one, two = opener(), opener()
    t = TableSpec("m", "t", 4)
    one.open_table(t)
    keys = np.arange(100, dtype=np.int64)
    one.insert(t.name, keys, rows(keys, 4))
    two.open_table(t)
    two.drop_table(t.name)
    u = TableSpec("m", "u", 4)
    two.open_table(u)  # takes the entry t had
    two.insert(u.name, keys, np.full((100, 4), 99.0, np.float32))
    got, found = one.fetch(t.name, keys[:3])  # t again, empty: not u's rows
    assert not found.any()
    one.insert(t.name, keys[:5], rows(keys[:5], 4))  # into t, not over u
    np.testing.assert_array_equal(two.fetch(u.name, keys)[0], np.full((100, 4), 99.0))
    assert one.size(t.name) == 5
    two.drop_table(t.name)  # recreated with another dimension: refused, not misread
    two.open_table(TableSpec("m", "t", 8))
    with pytest.raises(ConfigError, match="dimension 8"):
        one.fetch(t.name, keys[:3])
    _extents_accounted(two)


def test_a_writer_waiting_for_a_segment_being_closed_gets_segment_closed() -> None:
    """A thread that waited for the segment while close() ran must not flock the closed
    descriptor (EBADF, or an unrelated file that reused its number): SegmentClosed, which
    the store answers by moving to the segment the name points at."""
    import threading

    from hps.storage._shm_segment import SegmentClosed

    name = unique_name("hps_test_shm")
    store = SharedHashMapStore(name, 8 * MiB)
    seg = store._seg
    raised: list[BaseException] = []

    def write() -> None:
        try:
            with seg.writing():
                pass
        except BaseException as exc:  # noqa: BLE001 - what it raised is the point
            raised.append(exc)

    try:
        with seg._locks.thread:  # close() under way: what it does, the thread waiting
            waiter = threading.Thread(target=write)
            waiter.start()
            seg._closed = True
            seg._locks.close()
        waiter.join(30)  # hang guard
        assert [type(e) for e in raised] == [SegmentClosed]
    finally:
        for suffix in ("", ".lock", ".users", ".turn"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm/{name}{suffix}")


def test_two_stores_closing_together_leave_no_file() -> None:
    """Each drops its claim on the segment before it lets the other have the lock, so the
    second to close is the last user and removes the files (both used to leave them)."""
    import threading

    for _ in range(10):
        name = unique_name("hps_test_shm")
        stores = [SharedHashMapStore(name, 8 * MiB) for _ in range(2)]
        start = threading.Barrier(2)

        def close(store: SharedHashMapStore, start: threading.Barrier = start) -> None:
            start.wait()
            store.close()

        threads = [threading.Thread(target=close, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)  # hang guard
        files = ("", ".lock", ".users", ".turn")
        left = [s for s in files if os.path.exists(f"/dev/shm/{name}{s}")]
        for suffix in left:
            os.unlink(f"/dev/shm/{name}{suffix}")
        assert left == []


def test_a_store_opened_while_the_last_user_removes_the_files_joins_the_new_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """B opens the lock files just before A, the last user, removes them: B must not keep
    the removed .lock (a store opened later would lock another file: two writers)."""
    import threading

    from hps.storage import _shm_locks

    name = unique_name("hps_test_shm")
    a = SharedHashMapStore(name, 8 * MiB)
    opened, got = threading.Event(), []
    init, remove = _shm_locks.SegmentLocks.__init__, _shm_locks.SegmentLocks.remove_files

    def init_and_say(self: _shm_locks.SegmentLocks, path: str) -> None:
        init(self, path)
        opened.set()

    def remove_once_b_opened(self: _shm_locks.SegmentLocks) -> None:
        monkeypatch.setattr(_shm_locks.SegmentLocks, "remove_files", remove)
        thread = threading.Thread(target=lambda: got.append(SharedHashMapStore(name, 8 * MiB)))
        thread.start()  # B: joins the old .users, opens the old .lock, waits for A's lock
        assert opened.wait(30)  # hang guard
        remove(self)
        got.append(thread)

    monkeypatch.setattr(_shm_locks.SegmentLocks, "__init__", init_and_say)
    monkeypatch.setattr(_shm_locks.SegmentLocks, "remove_files", remove_once_b_opened)
    a.close()
    got[0].join(30)
    b = got[1]
    try:
        assert os.fstat(b._seg._locks.fd).st_ino == os.stat(f"/dev/shm/{name}.lock").st_ino
        c = SharedHashMapStore(name, 8 * MiB)  # locks the same file as B
        assert os.fstat(c._seg._locks.fd).st_ino == os.fstat(b._seg._locks.fd).st_ino
        c.close()
    finally:
        b.close()
    assert not any(os.path.exists(f"/dev/shm/{name}{s}") for s in ("", ".lock", ".users", ".turn"))


def test_a_full_folder_evicts_and_says_so(
    opener: Opener, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """/dev/shm cannot back more extents: the segment behaves as full (rows evicted for
    room, never a SIGBUS) and a warning names it, once a minute."""
    import errno

    from hps.storage import _shm_extents

    store = opener()
    spec = TableSpec("m", "t", 4)
    store.open_table(spec)
    keys = np.arange(2000, dtype=np.int64)
    store.insert(spec.name, keys, rows(keys, 4))

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_shm_extents.os, "posix_fallocate", full)
    more = np.arange(10_000, 30_000, dtype=np.int64)
    with caplog.at_level("WARNING"):
        for lo in range(0, more.size, 2000):
            store.insert(spec.name, more[lo : lo + 2000], rows(more[lo : lo + 2000], 4))
    said = [r for r in caplog.records if "is full" in r.getMessage()]
    assert len(said) == 1 and "evicting rows" in said[0].getMessage()
    assert store.size(spec.name) < 22_000  # some rows gave way
    got, found = store.fetch(spec.name, more[-2000:])
    assert found.all()  # the newest batch is in
    _extents_accounted(store)


def test_registry_full(opener: Opener) -> None:
    store = opener()
    for i in range(MAX_TABLES):
        store.open_table(TableSpec("m", f"t{i}", 1))
    with pytest.raises(BackendError, match="table entries"):
        store.open_table(TableSpec("m", "one_more", 1))


def test_a_segment_keeps_the_table_count_it_was_created_with(
    opener: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment created when 64 entries were the bound is read with 64 (its layout), not
    with today's larger bound."""
    from hps.storage import _shm_segment

    monkeypatch.setattr(_shm_segment, "MAX_TABLES", 64)
    old = opener()  # created with 64 entries
    monkeypatch.undo()
    store = opener()  # opens the same segment
    assert store._seg.max_tables == old._seg.max_tables == 64  # noqa: SLF001
    for i in range(64):
        store.open_table(TableSpec("m", f"t{i}", 1))
    with pytest.raises(BackendError, match="all 64 table entries are in use"):
        store.open_table(TableSpec("m", "one_more", 1))


def test_a_writer_death_clears_only_the_tables_it_was_changing(opener: Opener) -> None:
    store = opener()
    a, b = TableSpec("m", "a", 4), TableSpec("m", "b", 4)
    keys = np.arange(5000, dtype=np.int64)
    for spec in (a, b):
        store.open_table(spec)
        store.insert(spec.name, keys, rows(keys, 4))
    # What a writer killed while changing table a leaves behind: both flags set, and an
    # extent taken from the free stack that no table records yet.
    store._seg.h[HeaderWord.DIRTY] = 1
    store._table(a.name).meta[EntryWord.DIRTY] = 1
    store._seg.h[HeaderWord.FREE_TOP] -= 1
    _, found = store.fetch(a.name, keys)
    assert not found.any() and store.size(a.name) == 0
    got, found = store.fetch(b.name, keys)
    assert found.all()
    np.testing.assert_array_equal(got, rows(keys, 4))
    assert store.stats()["repairs"] == 1
    _extents_accounted(store)  # the leaked extent is free again
    store.insert(a.name, keys, rows(keys, 4))
    assert store.fetch(a.name, keys)[1].all()
    _extents_accounted(store)


def test_lifecycle_auto_remove_and_persistence(opener: Opener) -> None:
    keep = opener(shared_memory_auto_remove=False)
    keep.open_table(TableSpec("m", "t", 2))
    keys = np.arange(7, dtype=np.int64)
    keep.insert("m.t", keys, rows(keys, 2))
    path = keep.path
    keep.close()
    assert os.path.exists(path)
    again = opener()  # attaches to the kept segment; auto-removes when it closes
    again.open_table(TableSpec("m", "t", 2))
    assert again.fetch("m.t", keys)[1].all()
    assert again.stats()["attached"] == 1
    again.close()
    assert not os.path.exists(path) and not os.path.exists(path + ".lock")


def test_config_errors(tmp_path: Any) -> None:
    for bad in ("a/b", "name\n"):
        with pytest.raises(ConfigError, match="shared_memory_name"):
            SharedHashMapStore(bad, 8 * MiB)
    with pytest.raises(ConfigError, match="too small"):
        SharedHashMapStore(unique_name("hps_test_shm"), 100 * 1024)
    name = unique_name("hps_test_shm")
    cfg = VolatileDBConfig(
        type="multi_process_hash_map", shared_memory_name=name, shared_memory_size=8 * MiB
    )
    store = open_store(cfg)
    assert isinstance(store, SharedHashMapStore) and store.path == f"/dev/shm/{name}"
    with pytest.raises(ConfigError, match="do not fit"):
        store.open_table(TableSpec("m", "huge", 100_000))
    store.close()
    assert not os.path.exists(f"/dev/shm/{name}")


@pytest.mark.parametrize(("dim", "limit"), [(16, 1.45), (64, 1.15)])
def test_bytes_per_row(opener: Opener, dim: int, limit: float) -> None:
    store = opener(256 * MiB)
    spec = TableSpec("m", "t", dim)
    store.open_table(spec)
    keys = np.random.default_rng(0).integers(0, 2**62, 200_000)
    store.insert(spec.name, keys, np.zeros((keys.size, dim), np.float32))
    per_row = store.nbytes(spec.name) / store.size(spec.name)
    assert per_row < limit * (8 + 4 * dim), per_row


def test_a_foreign_file_is_refused_and_left_alone() -> None:
    name = unique_name("hps_test_shm")
    path = f"/dev/shm/{name}"
    with open(path, "wb") as f:
        f.write(b"not ours" * 1024 * 1024)
    try:
        with pytest.raises(BackendError, match="not an HPS shared hash map"):
            SharedHashMapStore(name, 8 * MiB)
        with open(path, "rb") as f:
            assert f.read(8) == b"not ours"
        assert not any(os.path.exists(path + s) for s in (".lock", ".users", ".turn"))
    finally:
        for suffix in ("", ".lock", ".users", ".turn"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path + suffix)


def test_a_forked_child_must_open_its_own_store(opener: Opener) -> None:
    store = opener()
    store.open_table(TableSpec("m", "t", 2))
    pid = os.fork()
    if pid == 0:  # child: refused, and closing leaves the parent's locks alone
        code = 1
        try:
            store.fetch("m.t", np.arange(3))
        except BackendError as exc:
            code = 0 if "forked child" in str(exc) else 2
        store.close()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    store.insert("m.t", np.arange(3), np.ones((3, 2), np.float32))
    assert store.fetch("m.t", np.arange(3))[1].all()


def test_a_writer_killed_with_the_lock_does_not_leave_it_held_by_its_idle_child() -> None:
    """flock locks belong to the open file, which a fork shares: the child's copies of the
    lock descriptors are closed at the fork, so the kernel drops a dead writer's lock even
    while an idle child it forked lives on."""
    import signal
    import threading

    name = unique_name("hps_test_shm")
    spec = TableSpec("m", "t", 2)
    read_end, write_end = os.pipe()
    writer = os.fork()
    if writer == 0:  # opens the store, forks an idle worker, dies holding the write lock
        store = SharedHashMapStore(name, 8 * MiB)
        store.open_table(spec)
        if os.fork() == 0:
            os.close(write_end)
            os.read(read_end, 1)  # idle until the test says it may go
            os._exit(0)
        with store._seg.writing():
            os.kill(os.getpid(), signal.SIGKILL)
    os.close(read_end)
    os.waitpid(writer, 0)
    done, opened = threading.Event(), []

    def insert() -> None:  # in a thread: opening takes the lock too
        other = SharedHashMapStore(name, 8 * MiB)
        opened.append(other)
        other.open_table(spec)
        other.insert(spec.name, np.arange(3), np.ones((3, 2), np.float32))
        done.set()

    thread = threading.Thread(target=insert)
    try:
        thread.start()
        assert done.wait(20)  # hang guard: before, it waited for the idle child to exit
    finally:
        os.write(write_end, b"x")  # the idle child goes
        os.close(write_end)
        thread.join(30)
        for other in opened:
            other.close()
        for suffix in ("", ".lock", ".users", ".turn"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm/{name}{suffix}")


def test_the_entry_records_the_format_float32_as_before(opener: Opener) -> None:
    """A float32 entry's DIM word is the dimension alone (what segments written before
    formats hold); another format is recorded above it and refused to other formats."""
    store = opener()
    store.open_table(TableSpec("m", "f", 6))
    store.open_table(TableSpec("m", "q", 6, row_dtype="int8"))
    words = {s: store._tables[s].meta[EntryWord.DIM] for s in ("m.f", "m.q")}
    assert words["m.f"] == 6 and words["m.q"] != 6
    other = opener()
    with pytest.raises(ConfigError, match="holds float32 rows of dimension 6.*--force"):
        other.open_table(TableSpec("m", "f", 6, row_dtype="float16"))
    with pytest.raises(ConfigError, match="holds int8 rows of dimension 6"):
        other.open_table(TableSpec("m", "q", 6))
    spec = TableSpec("m", "q", 6, row_dtype="int8")
    other.open_table(spec)
    values = spec.fmt.encode(rows(np.arange(5), 6))
    store.insert(spec.name, np.arange(5), values)
    got, found = other.fetch(spec.name, np.arange(6))
    assert found.tolist() == [True] * 5 + [False]
    np.testing.assert_array_equal(got[:5], values)
