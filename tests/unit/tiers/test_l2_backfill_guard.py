"""A queued L2 backfill (``cache_missed_embeddings``) never brings back a row this process
deleted or changed after the backfill's L3 read: :class:`hps.tiers.tiers.L2Writes`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hps.build import build_session
from hps.lookup import LookupSession
from hps.tiers.l2_writes import L2Writes
from hps.types import UpdateBatch
from hps.updates.applier import Applier
from hps.updates.journal import Journal
from hps.updates.journal_follower import JournalFollower
from tests.helpers import make_config, rows

T = "demo.t0"
KEYS = np.arange(10, 20, dtype=np.int64)


@pytest.fixture
def session(tmp_path: Path) -> Iterator[LookupSession]:
    cfg = make_config(tmp_path, volatile_db={"type": "hash_map", "cache_missed_embeddings": True})
    s = build_session(cfg, with_cache=False)
    yield s
    s.close()


def _queued_backfill(s: LookupSession) -> threading.Event:
    """Rows of KEYS in L3 only, looked up once while the background worker is busy: their
    L2 backfill waits for the returned gate."""
    assert s.tiers.persistent is not None
    s.tiers.persistent.insert(T, KEYS, rows(KEYS, 4))
    gate = threading.Event()
    s.pipeline.background("test", gate.wait)
    np.testing.assert_array_equal(s.lookup(T, KEYS), rows(KEYS, 4))  # L3 read, copy queued
    return gate


def _l2(s: LookupSession) -> tuple[np.ndarray, np.ndarray]:
    assert s.tiers.volatile is not None
    return s.tiers.volatile.fetch(T, KEYS)


def test_a_delete_after_the_read_is_not_undone(session: LookupSession) -> None:
    gate = _queued_backfill(session)
    session.tiers.remove(T, KEYS[:4])
    gate.set()
    session.drain()
    _, found = _l2(session)
    assert not found[:4].any()  # deleted: not brought back
    assert found[4:].all()  # the others were copied
    np.testing.assert_array_equal(session.lookup(T, KEYS[:4]), np.full((4, 4), 0.5))


def test_an_applier_delete_after_the_read_is_not_undone(session: LookupSession) -> None:
    applier = Applier(session.tables, session.tiers)
    applier.apply([UpdateBatch(T, KEYS, rows(KEYS, 4), version=1)])
    assert session.tiers.volatile is not None
    session.tiers.volatile.remove(T, KEYS)  # in L3 only, as past L2's initial_cache_rate
    gate = threading.Event()
    session.pipeline.background("test", gate.wait)
    session.lookup(T, KEYS)
    applier.apply([UpdateBatch(T, KEYS[:3], None, version=2, delete=True)])  # a Kafka delete
    gate.set()
    session.drain()
    _, found = _l2(session)
    assert not found[:3].any()
    assert found[3:].all()
    np.testing.assert_array_equal(session.lookup(T, KEYS[:3]), np.full((3, 4), 0.5))


def test_a_journal_followers_drop_after_the_read_is_not_undone(
    session: LookupSession, tmp_path: Path
) -> None:
    journal = Journal(tmp_path / "journal")
    follower = JournalFollower(journal, "reader", "demo")
    follower.attach(session, own_l2=True, shared_backfill=False)
    gate = _queued_backfill(session)
    assert session.tiers.persistent is not None
    session.tiers.persistent.insert(T, KEYS, rows(KEYS, 4, seed=1))  # the control plane's L3
    journal.append("upsert", T, KEYS)
    follower.poll()  # drops the keys from its own L2
    gate.set()
    session.drain()
    _, found = _l2(session)
    assert not found.any()  # the old rows did not come back
    np.testing.assert_array_equal(session.lookup(T, KEYS), rows(KEYS, 4, seed=1))
    follower.stop()


def test_a_whole_table_write_drops_every_backfill_read_before_it_ends() -> None:
    writes = L2Writes(limit=64)
    store = _Absent()
    keys = np.arange(5, dtype=np.int64)
    before = writes.token()
    with writes.writing(T, None):
        assert writes.insert_absent(store, T, keys, keys, writes.token()) == 0  # under way
    assert writes.insert_absent(store, T, keys, keys, before) == 0  # read before its end
    assert writes.insert_absent(store, T, keys, keys, writes.token()) == 5
    assert store.inserted == [5]


def test_the_log_is_bounded_and_tells_tables_apart() -> None:
    writes = L2Writes(limit=64)
    store = _Absent()
    keys = np.arange(4, dtype=np.int64)
    token = writes.token()
    with writes.writing("demo.t1", keys):  # the same keys, another table
        assert writes.insert_absent(store, T, keys, keys, token) == 4
    with writes.writing(T, keys[:1]):
        pass
    assert writes.insert_absent(store, T, keys, keys, token) == 3
    for lo in range(0, 640, 4):  # ten times what the log keeps
        with writes.writing(T, np.arange(100 + lo, 104 + lo, dtype=np.int64)):
            pass
    assert writes.insert_absent(store, T, keys, keys, token) == 0  # lost track: dropped whole
    assert writes._log.nbytes == L2Writes(limit=64)._log.nbytes  # allocated once
    big = np.arange(1000, dtype=np.int64)  # more than it keeps: backfills skip meanwhile
    token = writes.token()
    with writes.writing(T, big):
        assert writes.insert_absent(store, T, keys, keys, writes.token()) == 0
    assert writes.insert_absent(store, T, keys, keys, token) == 0


class _Absent:
    """A store's ``insert_absent`` that counts the keys it is given."""

    def __init__(self) -> None:
        self.inserted: list[int] = []

    def insert_absent(self, table: str, keys: np.ndarray, values: np.ndarray) -> None:
        self.inserted.append(int(keys.size))
