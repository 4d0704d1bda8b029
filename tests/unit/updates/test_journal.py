"""The change journal: control-plane writes reach a serving session without a reload.

Real RocksDB (the session follows it as a secondary, as a serving process does) and a real
in-process L2 of the session's own; the "control plane" writes L3 with its own Tiers.
"""

from __future__ import annotations

import json
import shutil
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
from hps.updates.journal import Journal, journal_dir
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
