"""The change journal: control-plane writes reach a serving session without a reload.

Real RocksDB (the session follows it as a secondary, as a serving process does) and a real
in-process L2 of the session's own; the "control plane" writes L3 with its own Tiers.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hps.build import build_session
from hps.config import PSConfig
from hps.io.sparse_model import write_sparse_model
from hps.lookup import LookupSession
from hps.tiers import Tiers, encode_rows
from hps.triton.serving import fill_l2, prepare_tables, serving_config
from hps.updates import journal as journal_mod
from hps.updates import journal_follower as journal_follower_mod
from hps.updates.journal import Change, Journal, journal_dir
from hps.updates.journal_follower import JournalFollower

TABLE = "m.t0"
KEYS = np.arange(50, dtype=np.int64) * 7


@pytest.fixture
def config(tmp_path: Path) -> PSConfig:
    rng = np.random.default_rng(1)
    write_sparse_model(tmp_path / "tables" / "t0", KEYS, rng.random((KEYS.size, 4), np.float32))
    doc = {
        "models": [
            {
                "model": "m",
                "sparse_files": ["tables/t0"],
                "embedding_table_names": ["t0"],
                "embedding_vecsize_per_table": [4],
                "default_value_for_each_table": [0.25],
                "gpucache": True,
                "gpucacheper": 1.0,
            }
        ],
        "volatile_db": {"type": "hash_map"},
        "persistent_db": {"type": "rocks_db", "path": "rocks"},
    }
    (tmp_path / "ps.json").write_text(json.dumps(doc))
    config = serving_config(tmp_path / "ps.json", tmp_path)
    prepare_tables(config)
    return config


def _journal(config: PSConfig) -> Journal:
    return Journal(journal_dir(Path(config.persistent_db.path)))


@pytest.fixture
def serving(config: PSConfig) -> Iterator[tuple[LookupSession, JournalFollower]]:
    """A serving process: its follower placed before its session opens L3."""
    follower = JournalFollower(_journal(config), "m_0.1", "m")
    session = build_session(config, l3_mode="secondary")
    fill_l2(session, config, config.model("m"))
    follower.attach(session, own_l2=True, shared_backfill=False)
    try:
        yield session, follower
    finally:
        follower.stop()
        session.close()


def _write_l3(config: PSConfig, keys: np.ndarray, vectors: np.ndarray | None) -> None:
    """What the control plane does without Kafka: L3 read-write, the serving L2 untouched."""
    tiers = Tiers.open(config, l3_mode="read_write", l2=False)
    try:
        tiers.open_tables(config.tables)
        spec = next(t for t in config.tables if t.name == TABLE)
        if vectors is None:
            tiers.remove(TABLE, keys, durable=True)
        else:
            tiers.write(TABLE, keys, encode_rows(spec, vectors), durable=True)
    finally:
        tiers.close()


def test_upsert_delete_and_warmup_reach_the_session(
    config: PSConfig, serving: tuple[LookupSession, JournalFollower]
) -> None:
    session, follower = serving
    changed = KEYS[:5]
    session.lookup(TABLE, changed)  # resident in L1, and in the session's own L2
    new = np.full((5, 4), 3.0, np.float32)
    _write_l3(config, changed, new)
    j = _journal(config)
    j.append("upsert", TABLE, changed)
    assert follower.poll() == 1
    np.testing.assert_allclose(session.lookup(TABLE, changed), new)
    assert follower.seq == 1

    _write_l3(config, KEYS[:2], None)
    j.append("delete", TABLE, KEYS[:2])
    follower.poll()
    got = session.lookup(TABLE, KEYS[:3])
    assert (got[:2] == 0.25).all() and (got[2] == 3.0).all()

    cache = session.caches[TABLE]
    warm = KEYS[20:30]
    assert not cache.resident(warm).any()
    j.append("warmup", TABLE, warm)
    j.append("warmup", "other.t", warm)  # another model's table: not ours
    assert follower.poll() == 2
    assert cache.resident(warm).all()
    assert follower.resyncs == 0


def test_an_import_too_large_to_list_refreshes_the_whole_table(
    config: PSConfig, serving: tuple[LookupSession, JournalFollower]
) -> None:
    session, follower = serving
    session.lookup(TABLE, KEYS)
    new = np.full((KEYS.size, 4), -1.0, np.float32)
    _write_l3(config, KEYS, new)
    _journal(config).append("upsert", TABLE, None)
    follower.poll()
    np.testing.assert_allclose(session.lookup(TABLE, KEYS), new)


def test_a_follower_that_fell_behind_drops_its_l1(
    config: PSConfig,
    serving: tuple[LookupSession, JournalFollower],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session, follower = serving
    monkeypatch.setattr(journal_mod, "MAX_ENTRIES", 3)
    session.lookup(TABLE, KEYS[:10])
    new = np.full((1, 4), 9.0, np.float32)
    _write_l3(config, KEYS[:1], new)
    j = _journal(config)
    for _ in range(6):  # the follower's cursor holds them back, the bound does not
        j.append("upsert", TABLE, KEYS[:1])
    assert j.seqs() == [4, 5, 6]
    follower.poll()
    assert follower.resyncs == 1 and follower.seq == 6
    assert session.caches[TABLE].resident_keys().size == 0
    np.testing.assert_allclose(session.lookup(TABLE, KEYS[:1]), new)  # own L2 refilled


def test_a_recreated_journal_drops_l1(
    config: PSConfig, serving: tuple[LookupSession, JournalFollower]
) -> None:
    session, follower = serving
    session.lookup(TABLE, KEYS[:10])
    shutil.rmtree(journal_dir(Path(config.persistent_db.path)))
    _journal(config).append("delete", TABLE, KEYS[:1])
    follower.poll()
    assert follower.resyncs == 1 and follower.seq == 1
    assert session.caches[TABLE].resident_keys().size == 0


def test_an_entry_it_cannot_read_drops_l1_and_the_next_ones_still_apply(
    config: PSConfig, serving: tuple[LookupSession, JournalFollower]
) -> None:
    session, follower = serving
    session.lookup(TABLE, KEYS[:10])
    j = _journal(config)
    bad = j.append("delete", TABLE, KEYS[:1])
    meta = json.loads(j._name(bad, ".json").read_text())
    meta["changes"][0]["kind"] = "purge"  # written by another release
    j._name(bad, ".json").write_text(json.dumps(meta))
    follower.poll()
    assert follower.resyncs == 1 and follower.seq == bad  # passed, not retried forever
    assert session.caches[TABLE].resident_keys().size == 0
    j.append("warmup", TABLE, KEYS[20:25])
    assert follower.poll() == 1 and session.caches[TABLE].resident(KEYS[20:25]).all()


def test_a_failing_poll_says_why_in_the_cursor_and_the_follower_goes_on(
    config: PSConfig,
    serving: tuple[LookupSession, JournalFollower],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session, follower = serving
    j = _journal(config)
    calls = 0
    real = j.head_stamp

    def failing() -> tuple[int, int]:  # what a stat of head.json may raise
        nonlocal calls
        calls += 1
        if calls <= 3:
            raise PermissionError(13, "Permission denied")
        return real()

    monkeypatch.setattr(follower.journal, "head_stamp", failing)
    follower.start()
    deadline = time.monotonic() + 30  # hang guard
    while calls == 0 or not _cursor(j).problem:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert "change journal: PermissionError" in str(_cursor(j).problem)
    seq = j.append("warmup", TABLE, KEYS[40:45])
    assert j.wait_applied("m", seq, timeout_s=30) == (1, 1)  # recovered; hang guard
    while _cursor(j).problem is not None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert session.caches[TABLE].resident(KEYS[40:45]).all()


def _cursor(j: Journal) -> journal_mod.Cursor:
    [cursor] = j.cursors()
    return cursor


def test_entries_leave_once_every_live_follower_applied_them(
    config: PSConfig, serving: tuple[LookupSession, JournalFollower]
) -> None:
    session, first = serving
    j = _journal(config)
    second = JournalFollower(j, "m_1.2", "m")
    second.attach(session, own_l2=False, shared_backfill=False)
    for _ in range(3):
        j.append("warmup", TABLE, KEYS[:1])
    first.poll()
    j.append("warmup", TABLE, KEYS[:1])
    assert j.seqs() == [1, 2, 3, 4]  # the second has applied none
    second.poll()
    assert j.wait_applied("m", 4, timeout_s=0) == (1, 2)
    first.poll()
    assert j.wait_applied("m", 4, timeout_s=0) == (2, 2)
    j.append("warmup", TABLE, KEYS[:1])
    assert j.seqs() == [5]
    second.stop()  # its cursor leaves with it
    assert [c.id for c in j.cursors()] == ["m_0.1"]


def test_the_thread_applies_entries_and_the_writer_waits_for_it(
    config: PSConfig, serving: tuple[LookupSession, JournalFollower]
) -> None:
    session, follower = serving
    follower.start()
    j = _journal(config)
    seq = j.append("warmup", TABLE, KEYS[40:45])
    assert j.wait_applied("m", seq, timeout_s=30) == (1, 1)  # hang guard
    assert session.caches[TABLE].resident(KEYS[40:45]).all()
    assert j.wait_applied("other", seq, timeout_s=30) == (0, 0)  # no follower: no wait


class _Recorded:
    """A Recorder that keeps what it is given."""

    def __init__(self) -> None:
        self.stages: list[str] = []
        self.fresh_at: list[tuple[str, int, int | None]] = []

    def stage(self, name: str, seconds: float) -> None:
        self.stages.append(name)

    def age(self, name: str, since_ns: int, now_ns: int | None = None) -> None:
        self.stages.append(name)

    def fresh(self, table: str, since_ns: int, now_ns: int | None = None) -> None:
        self.fresh_at.append((table, since_ns, now_ns))


def test_update_entries_keep_their_rows_and_timestamps(config: PSConfig) -> None:
    """hps consume's entries: several tables in one, stored rows of any format, the
    publish timestamps of their messages."""
    j = _journal(config)
    rows = np.arange(12, dtype=np.uint8).reshape(3, 4)  # an int8 table's stored rows
    seq = j.append_changes(
        [
            Change("upsert", TABLE, KEYS[:3], rows, (11, 12), from_updates=True),
            Change("delete", "m.t1", KEYS[3:4], None, (13,), from_updates=True),
        ]
    )
    entry = j.read(seq)
    assert entry is not None and entry.time_ns > 0
    up, rm = entry.changes
    np.testing.assert_array_equal(up.rows, rows)
    assert up.rows is not None and up.rows.dtype == np.uint8
    assert (up.kind, up.table, up.published_ns, up.from_updates) == (
        "upsert",
        TABLE,
        (11, 12),
        True,
    )
    assert rm.keys is not None and rm.keys.tolist() == [21] and rm.rows is None
    assert (rm.kind, rm.published_ns) == ("delete", (13,))


def test_update_entries_refresh_l1_from_their_rows(
    config: PSConfig, serving: tuple[LookupSession, JournalFollower]
) -> None:
    """Resident rows take the entry's rows at once, with nothing read below L1 (L2/L3 hold
    the update already: here they do not, so a re-read would show the old rows); a
    non-resident key stays out of L1; each update's freshness is recorded: when L1 took it
    if a key was resident, else when the entry was appended (L2/L3 served it from then)."""
    session, follower = serving
    recorded = _Recorded()
    follower.attach(session, own_l2=True, shared_backfill=False, recorder=recorded)
    cache = session.caches[TABLE]
    session.lookup(TABLE, KEYS[:4])
    j = _journal(config)
    spec = session.tables[TABLE]
    new = np.full((4, 4), 5.0, np.float32)
    resident_part = Change(
        "upsert", TABLE, KEYS[:4], encode_rows(spec, new), (100,), from_updates=True
    )
    cold_part = Change(
        "upsert", TABLE, KEYS[30:32], encode_rows(spec, new[:2]), (200,), from_updates=True
    )
    before_ns = time.time_ns()
    seq = j.append_changes([resident_part, cold_part])
    entry = j.read(seq)
    assert entry is not None
    assert follower.poll() == 1
    np.testing.assert_allclose(session.lookup(TABLE, KEYS[:4]), new)
    assert not cache.resident(KEYS[30:32]).any()
    (t1, p1, at1), (t2, p2, at2) = recorded.fresh_at
    assert (t1, p1, t2, p2) == (TABLE, 100, TABLE, 200)
    assert at1 is not None and at1 >= before_ns and at2 == entry.time_ns
    assert {"journal", "l1_refresh"} <= set(recorded.stages)

    j.append_changes([Change("delete", TABLE, KEYS[:2], None, (300,), from_updates=True)])
    follower.poll()
    assert not cache.resident(KEYS[:2]).any() and cache.resident(KEYS[2:4]).all()
    assert recorded.fresh_at[-1][:2] == (TABLE, 300)


def test_update_entries_skip_the_l3_catch_up(
    config: PSConfig,
    serving: tuple[LookupSession, JournalFollower],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A secondary L3's catch-up re-reads the writer's WAL: entries that carry their rows
    do not need it, a control-plane entry does (once per poll)."""
    session, follower = serving
    calls: list[int] = []
    monkeypatch.setattr(session.tiers, "catch_up", lambda: calls.append(1))
    j = _journal(config)
    rows = encode_rows(session.tables[TABLE], np.ones((2, 4), np.float32))
    j.append_changes([Change("upsert", TABLE, KEYS[:2], rows, (), from_updates=True)])
    follower.poll()
    assert calls == []
    j.append_changes([Change("upsert", TABLE, KEYS[:2], rows, (), from_updates=True)])
    j.append("upsert", TABLE, KEYS[:1])
    follower.poll()
    assert calls == [1]


def test_the_thread_sees_a_new_head_between_polls(
    config: PSConfig,
    serving: tuple[LookupSession, JournalFollower],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The follower compares the head's stat every FOLLOW_S: an entry is taken long before
    the next full POLL_S when that is made long."""
    session, follower = serving
    session.lookup(TABLE, KEYS[:1])
    j = _journal(config)
    new = np.full((1, 4), 7.0, np.float32)
    rows = encode_rows(session.tables[TABLE], new)
    monkeypatch.setattr(journal_follower_mod, "POLL_S", 3600.0)  # only a moved head wakes it
    follower.start()
    seq = j.append_changes([Change("upsert", TABLE, KEYS[:1], rows, (), from_updates=True)])
    assert j.wait_applied("m", seq, timeout_s=30) == (1, 1)  # hang guard
    np.testing.assert_allclose(session.lookup(TABLE, KEYS[:1]), new)


def test_entries_removed_unread_are_warned_of_once_a_minute(
    config: PSConfig,
    serving: tuple[LookupSession, JournalFollower],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """hps consume appends an entry per batch: a follower gone without removing its cursor
    must not make every append log a warning."""
    monkeypatch.setattr(journal_mod, "MAX_ENTRIES", 3)
    j = _journal(config)
    caplog.set_level(logging.WARNING, logger=journal_mod.__name__)
    for _ in range(10):  # the follower (never polled) holds them all back
        j.append("warmup", TABLE, KEYS[:1])
    warnings = [r.getMessage() for r in caplog.records if "removed unread" in r.getMessage()]
    assert len(warnings) == 1 and "1 entries removed unread (latest 1)" in warnings[0]
    assert j.seqs() == [8, 9, 10]
