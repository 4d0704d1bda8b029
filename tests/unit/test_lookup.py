"""LookupSession over the embedded tiers (hash_map L2 + RocksDB L3), no L1."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hps.build import build_session
from hps.errors import (
    AccessRefused,
    BackendUnavailable,
    BatchTooLargeError,
    DTypeError,
    InvalidValueError,
    ShapeError,
    UnknownTableError,
)
from hps.lookup import LookupSession
from tests.helpers import make_config, rows


@pytest.fixture
def session(tmp_path: Path) -> Iterator[LookupSession]:
    s = build_session(make_config(tmp_path))
    yield s
    s.close()


def test_levels_and_defaults_in_request_order(session: LookupSession) -> None:
    l2_keys = np.array([1, 2, 3], dtype=np.int64)
    l3_keys = np.array([10, 11], dtype=np.int64)
    assert session.tiers.volatile is not None and session.tiers.persistent is not None
    session.tiers.volatile.insert("demo.t0", l2_keys, rows(l2_keys, 4))
    session.tiers.persistent.insert("demo.t0", l3_keys, rows(l3_keys, 4))
    query = np.array([11, 1, 99, 1, 3, 10], dtype=np.int64)
    got = session.lookup("demo.t0", query)
    expected = rows(query, 4)
    expected[2] = 0.5  # the table's default value
    np.testing.assert_array_equal(got, expected)
    counts = session.stats()["tables"]["demo.t0"]
    assert (counts["l2"], counts["l3"], counts["default"], counts["keys"]) == (2, 2, 1, 6)


def test_hit_rates_count_requests_not_warm_ups_prefetches_or_refreshes(tmp_path: Path) -> None:
    model = {"model": "demo", "embedding_table_names": ["t0"], "embedding_vecsize_per_table": [4],
             "max_batch_size": 16, "gpucache": True, "gpucacheper": 1.0,
             "hps_cache": {"device": "numpy"}}  # fmt: skip
    s = build_session(make_config(tmp_path, models=[model]))
    try:
        keys = np.arange(1, 9, dtype=np.int64)
        assert s.tiers.persistent is not None
        s.tiers.persistent.insert("demo.t0", keys, rows(keys, 4))
        assert s.warm_up("demo.t0", keys[:4], pin=True) == 4
        assert s.prefetch("demo.t0", keys[4:6]) == 2
        s.refresh("demo.t0", keys[:2])
        s.drain()
        counts = s.stats()["tables"]["demo.t0"]
        assert (counts["l1"], counts["l2"], counts["l3"], counts["default"]) == (0, 0, 0, 0)
        np.testing.assert_array_equal(s.lookup("demo.t0", keys), rows(keys, 4))
        counts = s.stats()["tables"]["demo.t0"]
        assert (counts["l1"], counts["l2"] + counts["l3"], counts["keys"]) == (6, 2, 8)
    finally:
        s.close()


def test_multi_table_request(session: LookupSession) -> None:
    k0, k1 = np.array([5, 6], np.int64), np.array([7, 8, 9], np.int64)
    session.insert("demo.t0", k0, rows(k0, 4))
    session.insert("demo.t1", k1[:2], rows(k1[:2], 8))
    out = session.lookup_request("demo", np.concatenate([k0, k1]), np.array([2, 3], np.int32))
    expected = np.concatenate([rows(k0, 4).ravel(), rows(k1[:2], 8).ravel(), np.full(8, -1.0)])
    np.testing.assert_array_equal(out, expected.astype(np.float32))


def test_backfill_into_l2(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, volatile_db={"type": "hash_map", "cache_missed_embeddings": True})
    s = build_session(cfg)
    keys = np.array([4, 5], np.int64)
    assert s.tiers.persistent is not None and s.tiers.volatile is not None
    s.tiers.persistent.insert("demo.t0", keys, rows(keys, 4))
    s.lookup("demo.t0", keys)
    s.drain()
    values, found = s.tiers.volatile.fetch("demo.t0", keys)
    assert found.all()
    np.testing.assert_array_equal(values, rows(keys, 4))
    s.close()


def test_a_backfill_queued_before_an_update_does_not_overwrite_it(tmp_path: Path) -> None:
    """A lookup reads a row from L3 and queues its copy into L2; an update writes L3 and L2
    before that copy runs: L2 keeps the update (a backfill adds only absent keys)."""
    cfg = make_config(tmp_path, volatile_db={"type": "hash_map", "cache_missed_embeddings": True})
    s = build_session(cfg, with_cache=False)
    keys = np.array([4, 5, 6], np.int64)
    assert s.tiers.persistent is not None and s.tiers.volatile is not None
    s.tiers.persistent.insert("demo.t0", keys, rows(keys, 4))
    gate = threading.Event()
    s.pipeline.background("test", gate.wait)  # the one background worker is busy
    np.testing.assert_array_equal(s.lookup("demo.t0", keys), rows(keys, 4))  # queues the copy
    newer = rows(keys[:2], 4) + 1
    s.tiers.write("demo.t0", keys[:2], newer)  # an update, as the applier writes it
    gate.set()
    s.drain()
    values, found = s.tiers.volatile.fetch("demo.t0", keys)
    assert found.all()
    np.testing.assert_array_equal(values[:2], newer)
    np.testing.assert_array_equal(values[2], rows(keys[2:], 4)[0])  # the absent one was copied
    np.testing.assert_array_equal(s.lookup("demo.t0", keys[:2]), newer)
    s.close()


@pytest.mark.parametrize(
    ("keys", "num_keys", "error", "message"),
    [
        (np.array([1.0, 2.0]), [1, 1], DTypeError, "keys must be int64"),
        (np.array([1, 2, 3]), [1, 1], ShapeError, "add up to 2 but 3 keys"),
        (np.array([1, 2]), [3, -1], ShapeError, "negative key count"),
        (np.array([1, 2]), [2], ShapeError, "1 key counts for 2 tables"),
        (np.arange(33), [33, 0], BatchTooLargeError, "33 keys exceed the limit of 32"),
        (np.array([1, 2]), [1.0, 1.0], ShapeError, "must be integers"),
    ],
)
def test_bad_requests(
    session: LookupSession, keys: np.ndarray, num_keys: list, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        session.lookup_request("demo", keys, np.asarray(num_keys))


def test_unknown_model_and_table(session: LookupSession) -> None:
    with pytest.raises(UnknownTableError, match="unknown model 'nope'"):
        session.lookup_request("nope", np.array([1]), np.array([1, 0]))
    with pytest.raises(UnknownTableError, match="demo.t9"):
        session.lookup("demo.t9", np.array([1]))


def test_bad_insert_changes_nothing(session: LookupSession) -> None:
    keys = np.array([1, 2], np.int64)
    session.insert("demo.t0", keys, rows(keys, 4))
    with pytest.raises(InvalidValueError):
        session.insert("demo.t0", keys, np.full((2, 4), np.nan, np.float32))
    with pytest.raises(ShapeError):
        session.insert("demo.t0", keys, np.ones((2, 5), np.float32))
    np.testing.assert_array_equal(session.lookup("demo.t0", keys), rows(keys, 4))


def test_remove_from_every_level(session: LookupSession) -> None:
    keys = np.array([1, 2], np.int64)
    session.insert("demo.t0", keys, rows(keys, 4))
    session.remove("demo.t0", keys[:1])
    got = session.lookup("demo.t0", keys)
    np.testing.assert_array_equal(got[0], np.full(4, 0.5, np.float32))
    np.testing.assert_array_equal(got[1], rows(keys[1:], 4)[0])


def test_l2_down_falls_through_to_l3(session: LookupSession) -> None:
    keys = np.array([3], np.int64)
    session.insert("demo.t0", keys, rows(keys, 4))

    class Down:
        def fetch(self, *_: object) -> None:
            raise BackendUnavailable("redis down")

    real, session.tiers.volatile = session.tiers.volatile, Down()  # type: ignore[assignment]
    try:
        np.testing.assert_array_equal(session.lookup("demo.t0", keys), rows(keys, 4))
    finally:
        session.tiers.volatile = real


def test_an_l2_refusing_reads_falls_through_to_l3(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Credentials rotated or a permission taken away: L3 holds every row, so lookups are
    answered from it, the refusal logged once per interval and counted; an L2 alone has
    nothing to fall back to and raises."""
    session = build_session(make_config(tmp_path))
    keys = np.array([3, 4], np.int64)
    session.insert("demo.t0", keys, rows(keys, 4))

    class Refusing:
        def fetch(self, *_: object) -> None:
            raise AccessRefused("fetch demo.t0: Redis refused the credentials")

        def insert_absent(self, *_: object) -> None:
            raise AccessRefused("insert demo.t0: Redis refused the credentials")

    real, session.tiers.volatile = session.tiers.volatile, Refusing()  # type: ignore[assignment]
    try:
        for _ in range(5):
            np.testing.assert_array_equal(session.lookup("demo.t0", keys), rows(keys, 4))
        session.drain()
        assert session.tiers.l2_read_errors == 5
        logged = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert logged == [
            "L2 refused a read of demo.t0, reading L3: fetch demo.t0: Redis refused the "
            "credentials",
        ]
        for _ in range(3):  # a backfill of every request failing: one line, named so
            session.pipeline.background("L2 backfill", session.tiers.backfill, "demo.t0",
                                        keys, rows(keys, 4))  # fmt: skip
        session.drain()
        logged = [r.getMessage() for r in caplog.records if "backfill" in r.getMessage()]
        assert logged == [
            "background L2 backfill failed: insert demo.t0: Redis refused the credentials"
        ]
        persistent, session.tiers.persistent = session.tiers.persistent, None
        try:
            with pytest.raises(AccessRefused, match="refused the credentials"):
                session.lookup("demo.t0", keys)
        finally:
            session.tiers.persistent = persistent
    finally:
        session.tiers.volatile = real
        session.close()


class FailingL2:
    """An L2 whose calls fail from the ``fail_at``-th on (0: never), counting them."""

    def __init__(self, real: object, fail_at: int) -> None:
        self.real, self.fail_at, self.calls = real, fail_at, 0

    def __getattr__(self, name: str) -> object:
        attr = getattr(self.real, name)
        if name not in ("insert", "remove", "fetch", "insert_absent"):
            return attr

        def call(*args: object, **kw: object) -> object:
            self.calls += 1
            if self.fail_at and self.calls >= self.fail_at:
                raise BackendUnavailable(f"{name}: Redis unavailable")
            return attr(*args, **kw)

        return call


@pytest.mark.parametrize("op", ["insert", "remove"])
def test_a_write_l2_fails_partway_never_leaves_l2_serving_the_old_row(
    tmp_path: Path, op: str, caplog: pytest.LogCaptureFixture
) -> None:
    """L2 failing before L3 is written: an error, nothing written anywhere; failing after:
    L3 took the write, L2 has no copy left to serve (read from L3), a warning and no error;
    L1 never keeps the older row either way."""
    for fail_at, raised in ((1, True), (2, False)):
        session = build_session(make_config(tmp_path / f"{op}{fail_at}"))
        keys = np.array([5, 6], np.int64)
        session.insert("demo.t0", keys, rows(keys, 4))
        session.lookup("demo.t0", keys)  # L1 and L2 hold the old rows
        real = session.tiers.volatile
        session.tiers.volatile = FailingL2(real, fail_at)  # type: ignore[assignment]
        new = rows(keys, 4, seed=9)
        try:
            if raised:
                with pytest.raises(BackendUnavailable):
                    getattr(session, op)("demo.t0", keys, *([new] if op == "insert" else []))
            else:
                getattr(session, op)("demo.t0", keys, *([new] if op == "insert" else []))
        finally:
            session.tiers.volatile = real
        want_l3 = rows(keys, 4) if raised else (new if op == "insert" else None)
        assert session.tiers.persistent is not None
        got, found = session.tiers.persistent.fetch("demo.t0", keys)
        if want_l3 is None:
            assert not found.any()
        else:
            np.testing.assert_array_equal(got, want_l3)
        in_l2 = session.tiers.volatile.fetch("demo.t0", keys)[1]  # type: ignore[union-attr]
        assert not in_l2.any() if not raised else True
        expected = want_l3 if want_l3 is not None else np.full((2, 4), 0.5, np.float32)
        np.testing.assert_array_equal(session.lookup("demo.t0", keys), expected)
        session.close()
    assert any("L2 missed a write of demo.t0 that L3 took" in r.getMessage()
               for r in caplog.records)  # fmt: skip
