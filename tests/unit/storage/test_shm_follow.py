"""multi_process_hash_map: a segment removed or replaced under its users
(docs/multi_process_hash_map.md).

The identity check (file + creation id), following the name, the rule that nobody unlinks
a segment that is not the one it opened, and the watch that refills a new segment from L3.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest

from hps.storage._shm_segment import path_identity
from hps.storage.hash_map import HashMapStore
from hps.storage.multi_process_hash_map import SharedHashMapStore
from hps.tiers import Tiers
from hps.tiers.shared_l2 import SharedL2Watch
from hps.types import TableSpec
from hps.updates.heartbeat import Heartbeat
from tests.helpers import unique_name

SIZE = 8 * 1024 * 1024
SPEC = TableSpec("m", "t", 4)
KEYS = np.arange(500, dtype=np.int64)


def _rows(version: float) -> np.ndarray:
    return np.full((KEYS.size, SPEC.dim), version, dtype=np.float32)


@pytest.fixture
def name() -> Iterator[str]:
    n = unique_name("hps_follow")
    yield n
    for suffix in ("", ".lock", ".users", ".turn"):
        path = f"/dev/shm/{n}{suffix}"
        if os.path.exists(path):
            os.unlink(path)


def _open(name: str, **kw: object) -> SharedHashMapStore:
    store = SharedHashMapStore(name, SIZE, identity_check_s=None, **kw)  # type: ignore[arg-type]
    store.open_table(SPEC)
    return store


def _remove_files(store: SharedHashMapStore) -> None:
    for suffix in ("", ".lock", ".users", ".turn"):
        os.unlink(store.path + suffix)


def test_identity_is_the_file_and_its_creation_id(name: str) -> None:
    a, b = _open(name), _open(name)
    assert a.identity == b.identity == path_identity(a.path)
    assert a.identity[2] != 0  # drawn when the segment was initialised
    assert a.current() and b.current()
    a.close()
    b.close()


def test_a_removed_segment_is_noticed_and_followed(name: str) -> None:
    a = _open(name)
    a.insert(SPEC.name, KEYS, _rows(1))
    old = a.identity
    _remove_files(a)
    assert not a.current()
    assert a.follow()
    assert a.current() and a.identity != old and a.generation == 1
    assert a.size(SPEC.name) == 0  # a new segment: rows come back from L3, not from the old one
    a.insert(SPEC.name, KEYS[:10], _rows(2)[:10])
    b = _open(name)  # a process opening by name sees what a writes now
    assert b.identity == a.identity and b.size(SPEC.name) == 10
    assert not a.follow()  # nothing changed since
    a.close()
    b.close()


def test_lock_files_removed_after_a_holder_followed_are_followed_too(name: str) -> None:
    """``rm /dev/shm/<name>*`` removes the segment, then its lock files: a process that
    follows in between opens the new segment with the old lock files; once those go, it
    follows again, so every user locks one ``.lock`` file."""
    a, b = _open(name), _open(name)
    os.unlink(a.path)
    assert a.follow()  # a new segment, with the lock files still at their paths
    for suffix in (".lock", ".users", ".turn"):
        os.unlink(a.path + suffix)
    assert b.follow()  # the new segment, with new lock files
    assert not a.current(), "a holds lock files no longer at their paths"
    assert a.follow() and a.current() and b.current()
    assert a.identity == b.identity
    assert a._seg._locks.at_paths() and b._seg._locks.at_paths()  # noqa: SLF001
    a.insert(SPEC.name, KEYS[:10], _rows(3)[:10])
    assert b.size(SPEC.name) == 10
    a.close()
    b.close()


def test_operations_follow_the_name_on_their_own(name: str) -> None:
    a = SharedHashMapStore(name, SIZE, identity_check_s=0.0)
    a.open_table(SPEC)
    _remove_files(a)
    a.insert(SPEC.name, KEYS, _rows(3))  # checks first, so it writes the new segment
    assert a.generation == 1
    b = _open(name)
    values, found = b.fetch(SPEC.name, KEYS)
    assert found.all() and (values == 3).all()
    a.close()
    b.close()


def test_a_segment_replaced_by_another_file_of_the_same_name_is_noticed(name: str) -> None:
    a = _open(name)
    os.unlink(a.path)  # only the segment: the lock files stay and are shared
    b = _open(name)  # creates the new one
    assert not a.current() and a.identity != b.identity
    a.follow()
    assert a.identity == b.identity
    a.close()
    b.close()


def test_the_last_user_of_an_old_segment_does_not_unlink_the_new_one(name: str) -> None:
    old = _open(name)
    _remove_files(old)  # users file too: old is alone on its own
    new = _open(name)
    new.insert(SPEC.name, KEYS, _rows(4))
    old.close()  # the last user of the old segment, with auto-remove
    for suffix in ("", ".lock", ".users", ".turn"):
        assert os.path.exists(new.path + suffix), suffix
    reader = _open(name)
    assert reader.size(SPEC.name) == KEYS.size  # not 0 of 500
    new.close()
    reader.close()
    assert not os.path.exists(new.path)  # the real last user still removes its own files


def test_a_stale_holder_that_follows_does_not_unlink_what_others_use(name: str) -> None:
    a, b = _open(name), _open(name)
    _remove_files(a)
    a.follow()
    b.follow()
    assert a.identity == b.identity
    a.close()
    assert os.path.exists(b.path)
    b.insert(SPEC.name, KEYS, _rows(5))
    b.close()


def _tiers(store: SharedHashMapStore) -> Tiers:
    l3 = HashMapStore()
    tiers = Tiers(store, l3)
    tiers.open_tables([SPEC])
    tiers.write(SPEC.name, KEYS, _rows(6))
    return tiers


def test_the_watch_refills_from_l3_and_reports_until_it_has(name: str) -> None:
    store = _open(name)
    tiers = _tiers(store)
    watch = SharedL2Watch(store, tiers, [SPEC], fill="overwrite", interval_s=0.0)
    assert watch.problem() is None and not watch.check()
    _remove_files(store)
    store.follow()  # as an operation would on its own
    assert watch.problem() is not None  # not ready until refilled
    heartbeat = Heartbeat()
    heartbeat.watch(watch)
    heartbeat._last = heartbeat._clock()  # the loop went round: only the watch speaks
    assert heartbeat.check(60) == watch.problem()
    assert watch.check(force=True)
    assert watch.problem() is None and heartbeat.check(60) is None
    values, found = store.fetch(SPEC.name, KEYS)
    assert found.all() and (values == 6).all()
    assert store.filled() == 1
    tiers.close()


def test_the_watch_of_a_beat_recovers_a_removal_noticed_on_its_own(name: str) -> None:
    store = _open(name)
    tiers = _tiers(store)
    heartbeat = Heartbeat()
    heartbeat.watch(SharedL2Watch(store, tiers, [SPEC], fill="overwrite", interval_s=0.0))
    _remove_files(store)
    heartbeat.beat()
    assert heartbeat.check(60) is None
    assert store.current() and store.size(SPEC.name) == KEYS.size
    tiers.close()


def test_if_empty_fills_once_and_others_only_reread(name: str) -> None:
    a, b = _open(name), _open(name)
    ta, tb = _tiers(a), _tiers(b)
    wa = SharedL2Watch(a, ta, [SPEC], fill="if_empty", interval_s=0.0)
    wb = SharedL2Watch(b, tb, [SPEC], fill="if_empty", interval_s=0.0)
    _remove_files(a)
    assert wa.check(force=True) and wb.check(force=True)
    assert a.identity == b.identity and a.size(SPEC.name) == KEYS.size
    assert a.filled() == 1  # b found the table full and did not fill it again
    ta.close()
    tb.close()
