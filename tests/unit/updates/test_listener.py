"""The L1 listener's pass 1 over one poll's messages (hps.updates.listener.refresh_from):
each key's newest row, with one update, one eviction, one hold per table; an older update
never overwrites a newer row pass 1 took, in one poll or a later one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.build import build_session
from hps.lookup import LookupSession
from hps.storage.hash_map import HashMapStore
from hps.tiers import Tiers
from hps.updates import codec
from hps.updates.freshness import L1Refresher, Offset, Served
from hps.updates.listener import NewestTaken, applied_by_group, refresh_from
from hps.updates.routing import Router
from tests.unit.updates.test_update_consumer_loop import SPEC, Msg, _one_table_config
from tests.unit.updates.test_update_timing import ListRecorder


def upsert(keys: list[int], value: float, offset: int) -> Msg:
    k = np.array(keys, dtype=np.int64)
    return Msg(codec.encode(k, np.full((k.size, 2), value, np.float32), offset + 1), offset)


def delete(keys: list[int], offset: int) -> Msg:
    return Msg(codec.encode(np.array(keys, dtype=np.int64), None, offset + 1, delete=True), offset)


class PartMsg(Msg):
    """A message of another partition."""

    def __init__(self, value: bytes, offset: int, partition: int) -> None:
        super().__init__(value, offset)
        self._p = partition

    def partition(self) -> int:
        return self._p


def versioned(
    keys: list[int], value: float | None, version: int, offset: int, partition: int = 0
) -> Msg:
    """An upsert (a delete for ``value`` None) of update version ``version``."""
    k = np.array(keys, dtype=np.int64)
    rows = None if value is None else np.full((k.size, 2), value, np.float32)
    return PartMsg(codec.encode(k, rows, version, delete=value is None), offset, partition)


def test_a_poll_leaves_each_key_with_its_newest_row(tmp_path: Path) -> None:
    session = build_session(_one_table_config(tmp_path), tiers=Tiers(HashMapStore(), None))
    cache = session.caches[SPEC.name]
    resident = np.arange(1, 7, dtype=np.int64)
    assert session.tiers.volatile is not None
    session.tiers.volatile.insert(SPEC.name, resident, np.ones((6, 2), np.float32))
    session.lookup(SPEC.name, resident)
    refresher, rec = L1Refresher(session, grace_s=60.0), ListRecorder()
    msgs = [
        upsert([1, 2], 10.0, 0),
        delete([2], 1),  # deleted after an upsert (version 2)
        upsert([1, 3], 20.0, 2),  # a later row of key 1 wins
        upsert([2], 30.0, 3),  # version 4: newer than the delete, key 2 stays with it
        Msg(b"not a message", 4),  # skipped, the others stand
        delete([9], 5),  # not resident: nothing to evict
        delete([4], 6),  # out of L1
    ]
    refresh_from(msgs, Router.fixed({SPEC.name: SPEC}), refresher, 300.0, Served(rec))
    assert cache.resident(np.array([1, 2, 3, 4, 5], dtype=np.int64)).tolist() == [
        True, True, True, False, True,
    ]  # fmt: skip
    got = session.lookup(SPEC.name, np.array([1, 2, 3, 5], dtype=np.int64))
    np.testing.assert_array_equal(got, [[20, 20], [30, 30], [20, 20], [1, 1]])
    # One hold and one pass 2 for the poll's keys of this partition, up to its last offset.
    assert refresher.pending == 1 and cache.held == 8
    # Served at once: the messages whose keys are all in L1 after pass 1, with rows.
    assert [ns // 10**6 % 1000 for _, ns in rec.fresh_seen] == [0, 2, 3]  # broker timestamps
    session.close()


def test_a_fill_racing_pass_one_does_not_cache_the_older_row(tmp_path: Path) -> None:
    """A lookup that reads L2 right after pass 1 (L2 does not hold the update yet) serves
    the older row but does not cache it: the keys were held before pass 1 wrote."""
    session = build_session(_one_table_config(tmp_path), tiers=Tiers(HashMapStore(), None))
    cache = session.caches[SPEC.name]
    key = np.array([7], dtype=np.int64)
    assert session.tiers.volatile is not None
    session.tiers.volatile.insert(SPEC.name, key, np.ones((1, 2), np.float32))  # not in L1
    refresher = L1Refresher(session, grace_s=60.0)
    pass_one = refresher.now
    seen: list[float] = []

    def then_a_lookup(table: str, keys: np.ndarray, rows: np.ndarray | None) -> None:
        pass_one(table, keys, rows)
        seen.append(float(session.lookup(SPEC.name, key)[0, 0]))  # fills from L2

    refresher.now = then_a_lookup  # type: ignore[method-assign]
    refresh_from([upsert([7], 5.0, 0)], Router.fixed({SPEC.name: SPEC}), refresher, 300.0, None)
    assert seen == [1.0] and not cache.resident(key).any()
    session.tiers.volatile.insert(SPEC.name, key, np.full((1, 2), 5.0, np.float32))  # L2: now
    np.testing.assert_array_equal(session.lookup(SPEC.name, key), [[5, 5]])
    session.close()


def _resident_session(tmp_path: Path, keys: list[int]) -> tuple[LookupSession, L1Refresher]:
    session = build_session(_one_table_config(tmp_path), tiers=Tiers(HashMapStore(), None))
    k = np.array(keys, dtype=np.int64)
    assert session.tiers.volatile is not None
    session.tiers.volatile.insert(SPEC.name, k, np.ones((k.size, 2), np.float32))
    session.lookup(SPEC.name, k)  # resident in L1
    return session, L1Refresher(session, grace_s=60.0)


def test_an_older_update_in_the_same_poll_does_not_overwrite_a_newer_one(
    tmp_path: Path,
) -> None:
    session, refresher = _resident_session(tmp_path, [1, 2, 3])
    msgs = [
        versioned([1], 104.0, 12, 0, partition=1),
        versioned([1], 99.0, 11, 0, partition=0),  # arrives later, older
        versioned([2], 50.0, 20, 1, partition=1),
        versioned([2], None, 19, 1, partition=0),  # an older delete loses
        versioned([3], 7.0, 30, 2, partition=1),
        versioned([3], 8.0, 30, 2, partition=0),  # equal versions: the later one
    ]
    refresh_from(msgs, Router.fixed({SPEC.name: SPEC}), refresher, 300.0, None)
    keys = np.array([1, 2, 3], dtype=np.int64)
    assert session.caches[SPEC.name].resident(keys).all()
    np.testing.assert_array_equal(session.lookup(SPEC.name, keys), [[104] * 2, [50] * 2, [8] * 2])
    session.close()


def test_an_older_update_in_a_later_poll_does_not_overwrite_a_newer_one(tmp_path: Path) -> None:
    session, refresher = _resident_session(tmp_path, [1, 2, 3])
    router, newest = Router.fixed({SPEC.name: SPEC}), NewestTaken()
    keys = np.array([1, 2, 3], dtype=np.int64)

    def poll(*msgs: Msg) -> np.ndarray:
        refresh_from(list(msgs), router, refresher, 300.0, None, newest)
        return session.lookup(SPEC.name, keys)[:, 0]

    assert poll(versioned([1, 2], 104.0, 12, 0, partition=1)).tolist() == [104, 104, 1]
    # Late, from another partition: older than what L1 took (an upsert, a delete).
    assert poll(versioned([1], 99.0, 11, 0), versioned([2], None, 10, 1)).tolist() == [
        104, 104, 1,
    ]  # fmt: skip
    assert session.caches[SPEC.name].resident(keys).all()
    # Newer ones still go through; a key never updated takes any version.
    assert poll(versioned([1, 3], 105.0, 13, 2), versioned([2], None, 12, 3)).tolist() == [
        105, 1, 105,
    ]  # fmt: skip
    assert session.caches[SPEC.name].resident(keys).tolist() == [True, False, True]
    session.close()


def test_newest_taken_is_bounded_and_forgets_keys_whose_slot_was_taken() -> None:
    newest = NewestTaken(slots=4)
    keys = np.arange(1, 1001, dtype=np.int64)
    assert newest.take("t", keys, np.full(keys.size, 10, np.uint64)).all()
    older = newest.take("t", keys, np.full(keys.size, 9, np.uint64))
    # At most one key a slot is remembered (refused: older); the others are taken.
    assert 1 <= np.count_nonzero(~older) <= 4
    assert newest.take("u", keys[:1], np.array([0], np.uint64)).all()  # per table


def test_pass_twos_given_up_on_a_full_queue_reread_their_tables_once_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hps consume away for long: the re-read queue overflows and its oldest pass 2s are
    given up. A key not in L1 at pass 1, filled from the stale L2 meanwhile, is still read
    again once the group has committed past the updates given up."""
    from hps.updates import freshness

    monkeypatch.setattr(freshness, "MAX_PENDING_KEYS", 2)
    session, refresher = _resident_session(tmp_path, [1])
    refresher.grace_s = 0.0
    key = np.array([7], dtype=np.int64)  # not resident at pass 1 of its update
    assert session.tiers.volatile is not None
    session.tiers.volatile.insert(SPEC.name, key, np.ones((1, 2), np.float32))  # the old row
    refresher.later(SPEC.name, key, token=Offset("t", 0, 5), held=True)
    refresher.later(SPEC.name, np.array([8, 9]), token=Offset("t", 0, 6), held=True)
    assert refresher.owed == {SPEC.name} and refresher.pending == 1  # key 7's given up
    np.testing.assert_array_equal(session.lookup(SPEC.name, key), [[1, 1]])  # stale fill
    not_yet = applied_by_group({("t", 0): 5})
    assert refresher.run_due(not_yet) == 0 and refresher.owed  # its update not in L2 yet
    session.tiers.volatile.insert(SPEC.name, key, np.full((1, 2), 3.0, np.float32))
    refresher.run_due(applied_by_group({("t", 0): 7}))
    assert not refresher.owed
    assert session.caches[SPEC.name].resident(key).all()
    np.testing.assert_array_equal(session.lookup(SPEC.name, key), [[3, 3]])
    session.close()
