"""L1 inside the LookupSession: dedup, misses from L2/L3, the sync/async threshold, prefetch,
warm-up and refresh, over the embedded tiers (hash_map L2 + RocksDB L3)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hps import startup
from hps.build import build_session
from hps.cache import EmbeddingCache
from hps.cache.refresh import Refresher
from hps.config import PSConfig
from hps.io.frequency import write_frequency_file
from hps.io.keyset import write_keyset
from hps.lookup import LookupSession
from hps.startup import refreshers_for, warm_up_session
from tests.helpers import make_config, rows

TABLE = "demo.t0"


def config(tmp_path: Path, **model: Any) -> PSConfig:
    hps_cache = {"capacity": 64, "device": "numpy", **model.pop("hps_cache", {})}
    doc = {
        "model": "demo",
        "embedding_table_names": ["t0"],
        "embedding_vecsize_per_table": [4],
        "maxnum_catfeature_query_per_table_per_sample": [64],
        "default_value_for_each_table": [0.5],
        "max_batch_size": 16,
        "gpucache": True,
        "hps_cache": hps_cache,
        **model,
    }
    return make_config(tmp_path, models=[doc])


@pytest.fixture
def stored(tmp_path: Path) -> np.ndarray:
    """200 rows in L2 and L3, written by a session that is closed again."""
    keys = np.arange(1, 201, dtype=np.int64) * 11
    s = build_session(config(tmp_path), with_cache=False)
    s.insert(TABLE, keys, rows(keys, 4))
    s.close()
    return keys


def open_session(tmp_path: Path, **model: Any) -> LookupSession:
    return build_session(config(tmp_path, **model))


def cache_of(session: LookupSession) -> EmbeddingCache:
    cache = session.caches[TABLE]
    assert isinstance(cache, EmbeddingCache)
    return cache


@pytest.fixture
def session(tmp_path: Path, stored: np.ndarray) -> Iterator[LookupSession]:
    s = open_session(tmp_path, hit_rate_threshold=0.5)
    yield s
    s.close()


def test_misses_come_from_l2_l3_and_fill_l1(session: LookupSession, stored: np.ndarray) -> None:
    request = np.array([stored[0], stored[1], stored[0], 999_999], dtype=np.int64)
    got = session.lookup(TABLE, request)
    expected = rows(request, 4)
    expected[3] = 0.5  # in no level: the default
    np.testing.assert_array_equal(got, expected)
    assert cache_of(session).resident(request).tolist() == [True, True, True, False]
    np.testing.assert_array_equal(session.lookup(TABLE, request), expected)
    counts = session.stats()["tables"][TABLE]
    assert counts["l1"] == 2  # the second lookup's unique stored keys


def _insert_threads(cache: EmbeddingCache) -> list[str]:
    names: list[str] = []
    original = cache.insert

    def insert(*args: Any, **kw: Any) -> None:
        names.append(threading.current_thread().name)
        original(*args, **kw)

    cache.insert = insert  # type: ignore[method-assign]
    return names


def test_below_the_threshold_inserts_on_the_request_path(
    session: LookupSession, stored: np.ndarray
) -> None:
    names = _insert_threads(cache_of(session))
    session.lookup(TABLE, stored[:10])  # hit rate 0 < 0.5
    assert names == [threading.current_thread().name]
    assert cache_of(session).resident(stored[:10]).all()  # no drain needed


def test_above_the_threshold_inserts_in_the_background(
    session: LookupSession, stored: np.ndarray
) -> None:
    session.lookup(TABLE, stored[:9])
    names = _insert_threads(cache_of(session))
    got = session.lookup(TABLE, stored[:10])  # 9 of 10 hit: 0.9 >= 0.5
    np.testing.assert_array_equal(got, rows(stored[:10], 4))  # the miss is never a default
    session.drain()
    assert names and names[0].startswith("hps-l1")
    assert cache_of(session).resident(stored[9:10]).all()


@pytest.mark.parametrize("threshold", [1.0, "1.1"])
def test_a_threshold_of_1_or_more_always_inserts_on_the_request_path(
    tmp_path: Path, stored: np.ndarray, threshold: object
) -> None:
    """HugeCTR's way to disable asynchronous insertion (its ps_template.json: "1.1"): even
    with HugeCTR's defaults for asynchronous misses, a miss is looked up and kept at once."""
    s = open_session(
        tmp_path, hit_rate_threshold=threshold, hps_cache={"default_on_async_miss": True}
    )
    try:
        s.lookup(TABLE, stored[:9])
        names = _insert_threads(cache_of(s))
        got = s.lookup(TABLE, stored[:10])  # 9 of 10 hit: 0.9, below the threshold
        np.testing.assert_array_equal(got, rows(stored[:10], 4))
        assert names == [threading.current_thread().name]
        assert cache_of(s).resident(stored[:10]).all()  # no drain needed
    finally:
        s.close()


def test_default_on_async_miss_is_an_opt_in(tmp_path: Path, stored: np.ndarray) -> None:
    s = open_session(tmp_path, hit_rate_threshold=0.5, hps_cache={"default_on_async_miss": True})
    try:
        s.lookup(TABLE, stored[:9])
        got = s.lookup(TABLE, stored[:10])
        np.testing.assert_array_equal(got[:9], rows(stored[:9], 4))
        np.testing.assert_array_equal(got[9], np.full(4, 0.5, np.float32))  # HugeCTR's way
        s.drain()
        np.testing.assert_array_equal(s.lookup(TABLE, stored[9:10]), rows(stored[9:10], 4))
    finally:
        s.close()


def test_prefetch_loads_keys_ahead_of_requests(session: LookupSession, stored: np.ndarray) -> None:
    assert session.prefetch(TABLE, np.concatenate([stored[20:30], [424242]])) == 10
    assert cache_of(session).resident(stored[20:30]).all()
    session.lookup(TABLE, stored[20:30])
    assert session.stats()["tables"][TABLE]["l1"] == 10


def test_a_cache_as_large_as_the_table_is_prefilled(tmp_path: Path, stored: np.ndarray) -> None:
    s = open_session(tmp_path, gpucacheper=1.0, hps_cache={"capacity": None})
    try:
        assert warm_up_session(s, config(tmp_path)) == {TABLE: stored.size}
        before = s.stats()["tables"][TABLE]
        got = s.lookup(TABLE, stored)
        np.testing.assert_array_equal(got, rows(stored, 4))
        after = s.stats()["tables"][TABLE]
        delta = {level: after[level] - before[level] for level in ("l1", "l2", "l3")}
        assert delta == {"l1": stored.size, "l2": 0, "l3": 0}  # a 100% hit rate
    finally:
        s.close()


def test_warm_up_from_a_frequency_file_and_a_keyset(tmp_path: Path, stored: np.ndarray) -> None:
    freq = tmp_path / "demo.t0.freq.npz"
    write_frequency_file(freq, stored[:100], np.arange(100, 0, -1))  # stored[0] is hottest
    keyset = tmp_path / "t0.keys"
    write_keyset(keyset, np.concatenate([stored[150:170], [stored[0]]]))
    cache_cfg = {
        "policy": "frequency",
        "capacity": 40,
        "static_fraction": 0.25,
        "frequency_file": str(tmp_path / "{model}.{table}.freq.npz"),
        "warmup_keyset": str(tmp_path / "{table}.keys"),
    }
    cfg = config(tmp_path, hps_cache=cache_cfg)
    s = build_session(cfg)
    try:
        assert warm_up_session(s, cfg) == {TABLE: 40}
        cache = cache_of(s)
        assert set(cache.pinned_keys().tolist()) == set(stored[:10].tolist())
        assert cache.resident(stored[:40]).all()  # the 40 hottest fill the cache
        assert not cache.resident(stored[150:170]).any()  # no room left for the keyset
    finally:
        s.close()


def test_a_warm_up_of_more_keys_than_fit_keeps_the_hottest(
    tmp_path: Path, stored: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyset of 150 keys, hottest first and not in key order, into 64 rows loaded in
    slices of 16: the 64 hottest are resident, whatever the key order and the slicing."""
    monkeypatch.setattr(startup, "WARMUP_CHUNK", 16)
    order = np.random.default_rng(5).permutation(150)
    hottest_first = stored[order]
    keyset = tmp_path / "t0.keys"
    write_keyset(keyset, np.concatenate([hottest_first[:3], hottest_first]))  # repeats too
    s = open_session(tmp_path)
    try:
        loaded = startup.warm_up_keysets(s, "demo", json.dumps({"t0": str(keyset)}))
        assert loaded == {TABLE: 64}
        cache = cache_of(s)
        assert cache.resident(hottest_first[:64]).all()
        assert not cache.resident(hottest_first[64:]).any()
    finally:
        s.close()


def test_refresh_rereads_resident_keys_in_slices(
    session: LookupSession, stored: np.ndarray
) -> None:
    session.lookup(TABLE, stored[:20])
    fresh = rows(stored[:20], 4) + 100
    assert session.tiers.volatile is not None and session.tiers.persistent is not None
    for store in (session.tiers.volatile, session.tiers.persistent):  # behind the cache's back
        store.insert(TABLE, stored[:20], fresh)
        store.remove(TABLE, stored[:2])
    calls: list[int] = []

    def refresh(table: str, keys: np.ndarray) -> None:
        calls.append(keys.size)
        session.refresh(table, keys)

    refresher = Refresher(session.caches, refresh, interval=1.0, percentage=0.1)  # 64 rows
    assert refresher.run_pass() == 20
    assert calls == [7, 7, 6]
    cache = cache_of(session)
    assert not cache.resident(stored[:2]).any()  # gone from L2/L3: gone from L1
    values, hit = cache.query(np.sort(stored[2:20]))
    assert hit.all()
    np.testing.assert_array_equal(values, fresh[2:])


def test_a_refresh_without_a_percentage_goes_in_bounded_slices(
    session: LookupSession, stored: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hps.cache import refresh as refresh_module

    monkeypatch.setattr(refresh_module, "MAX_SLICE", 8)
    session.lookup(TABLE, stored[:20])
    calls: list[int] = []
    refresher = Refresher(session.caches, lambda t, k: calls.append(k.size), interval=1.0)
    assert refresher.run_pass() == 20 and calls == [8, 8, 4]  # not one slice of 20


def test_refresher_thread_runs_after_its_delay_and_stops(
    session: LookupSession, stored: np.ndarray
) -> None:
    session.lookup(TABLE, stored[:5])
    seen = threading.Event()

    def refresh(table: str, keys: np.ndarray) -> None:
        seen.set()

    start = time.monotonic()  # before the thread starts: its delay cannot end earlier
    with Refresher(session.caches, refresh, interval=0.01, delay=0.05) as r:
        assert seen.wait(30)  # hang guard
        assert time.monotonic() - start >= 0.04  # the 0.05 s delay, less clock rounding
    assert r.passes >= 1
    assert not Refresher(session.caches, refresh, interval=0).start().enabled


def test_a_refresh_pass_that_fails_outside_its_slices_does_not_end_the_thread(
    session: LookupSession, stored: np.ndarray
) -> None:
    session.lookup(TABLE, stored[:5])
    failures = [MemoryError("out of GPU memory")]  # e.g. reading the resident keys
    refreshed = threading.Event()

    def before_pass() -> None:
        if failures:
            raise failures.pop()

    r = Refresher(session.caches, lambda t, k: refreshed.set(), interval=0.01,
                  before_pass=before_pass)  # fmt: skip
    with r:
        assert refreshed.wait(30)  # hang guard: the pass after the failed one ran
    assert r.passes >= 1 and not failures


@pytest.mark.parametrize(
    ("times", "named"),
    [
        ({"interval": 1e10}, "interval"),
        ({"interval": 1.0, "delay": float("inf")}, "delay"),
        ({"interval": float("nan")}, "interval"),
        ({"interval": -1.0}, "interval"),
    ],
)
def test_a_refresher_refuses_waits_its_thread_cannot_make(
    session: LookupSession, times: dict[str, float], named: str
) -> None:
    """1e10 s overflowed ``Event.wait`` (past ``threading.TIMEOUT_MAX``) in the thread,
    which died; the refresher is refused where it is made instead."""
    with pytest.raises(ValueError, match=rf"refresh {named}"):
        Refresher(session.caches, lambda t, k: None, **times)


def test_refreshers_follow_the_config(tmp_path: Path, stored: np.ndarray) -> None:
    cfg = config(tmp_path, refresh_interval=30.0, refresh_delay=5.0)
    s = build_session(cfg)
    try:
        (r,) = refreshers_for(s, cfg)
        assert (r.interval, r.delay, list(r.caches)) == (30.0, 5.0, [TABLE])
        assert refreshers_for(s, config(tmp_path)) == []  # refresh_interval 0: disabled
    finally:
        s.close()


def test_a_refresh_pass_catches_l3_up_once_and_only_when_l2_misses(
    tmp_path: Path, stored: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config(tmp_path, refresh_interval=30.0)
    s = build_session(cfg)
    try:
        catch_ups: list[int] = []
        monkeypatch.setattr(s.tiers, "catch_up", lambda: catch_ups.append(1))
        assert s.tiers.volatile is not None
        s.tiers.volatile.insert(TABLE, stored[:20], rows(stored[:20], 4))
        s.lookup(TABLE, stored[:20])
        (r,) = refreshers_for(s, cfg)
        assert r.run_pass() == 20 and catch_ups == []  # L2 held every key
        s.tiers.volatile.remove(TABLE, stored[:2])
        assert r.run_pass() == 20 and len(catch_ups) == 1
        assert r.run_pass() == 20 and len(catch_ups) == 2  # once a pass
    finally:
        s.close()
