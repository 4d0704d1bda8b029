"""The L1 listener's pass 1 over one poll's messages (hps.updates.listener.refresh_from):
the same L1 as one message at a time, with one update, one eviction, one hold per table."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hps.build import build_session
from hps.storage.hash_map import HashMapStore
from hps.tiers import Tiers
from hps.updates import codec
from hps.updates.freshness import L1Refresher, Served
from hps.updates.listener import refresh_from
from hps.updates.routing import Router
from tests.unit.updates.test_update_consumer_loop import SPEC, Msg, _one_table_config
from tests.unit.updates.test_update_timing import ListRecorder


def upsert(keys: list[int], value: float, offset: int) -> Msg:
    k = np.array(keys, dtype=np.int64)
    return Msg(codec.encode(k, np.full((k.size, 2), value, np.float32), offset + 1), offset)


def delete(keys: list[int], offset: int) -> Msg:
    return Msg(codec.encode(np.array(keys, dtype=np.int64), None, offset + 1, delete=True), offset)


def test_a_poll_leaves_l1_as_its_messages_one_by_one_would(tmp_path: Path) -> None:
    session = build_session(_one_table_config(tmp_path), tiers=Tiers(HashMapStore(), None))
    cache = session.caches[SPEC.name]
    resident = np.arange(1, 7, dtype=np.int64)
    assert session.tiers.volatile is not None
    session.tiers.volatile.insert(SPEC.name, resident, np.ones((6, 2), np.float32))
    session.lookup(SPEC.name, resident)
    refresher, rec = L1Refresher(session, grace_s=60.0), ListRecorder()
    msgs = [
        upsert([1, 2], 10.0, 0),
        delete([2], 1),  # deleted after an upsert: out of L1
        upsert([1, 3], 20.0, 2),  # a later row of key 1 wins
        upsert([2], 30.0, 3),  # not resident any more: pass 1 leaves it out
        Msg(b"not a message", 4),  # skipped, the others stand
        delete([9], 5),  # not resident: nothing to evict
    ]
    refresh_from(msgs, Router.fixed({SPEC.name: SPEC}), refresher, 300.0, Served(rec))
    assert cache.resident(np.array([1, 2, 3, 4], dtype=np.int64)).tolist() == [
        True, False, True, True,
    ]  # fmt: skip
    got = session.lookup(SPEC.name, np.array([1, 3, 4], dtype=np.int64))
    np.testing.assert_array_equal(got, [[20, 20], [20, 20], [1, 1]])
    # One hold and one pass 2 for the poll's keys of this partition, up to its last offset.
    assert refresher.pending == 1 and cache.held == 7
    # Served at once: only the message whose keys are all in L1 with its rows (offset 2).
    assert [ns // 10**6 % 1000 for _, ns in rec.fresh_seen] == [2]  # its broker timestamp
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
