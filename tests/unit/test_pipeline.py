"""The one lookup pipeline (hps.pipeline): whole requests over compiled L1 probes against the
reference (the NumPy probe, tables looked up one by one), concurrent updates, and a session
that is whole when built.

Moved from tests/unit/cache/test_fused_property.py with the fused path it tested: the same
assertions, the reference now being the NumPy L1 probe with a lookup per table.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hps.build import build_session
from hps.cache.embedding_cache import EmbeddingCache
from hps.lookup import LookupSession
from hps.storage.hash_map import HashMapStore
from hps.tiers import Tiers
from tests.helpers import make_config
from tests.unit.cache.test_fused_property import SETTINGS

TABLES = (("demo.t0", 4), ("demo.t1", 8), ("demo.t2", 4))


def _session(
    tmp_path: object,
    data: dict[str, tuple[np.ndarray, np.ndarray]],
    threshold: float,
    *,
    reference: bool = False,
) -> LookupSession:
    """Three cached tables over an in-memory L2; ``reference``: L1 probes on NumPy."""
    cfg = make_config(
        tmp_path,
        models=[
            {
                "model": "demo",
                "embedding_table_names": ["t0", "t1", "t2"],
                "embedding_vecsize_per_table": [4, 8, 4],
                "default_value_for_each_table": [0.5, -1.0, 2.0],
                "max_batch_size": 1024,
                "gpucache": True,
                "hit_rate_threshold": threshold,
                "hps_cache": {"capacity": 64, "device": "numpy"},
            }
        ],
        persistent_db={"type": "disabled"},
    )
    l2 = HashMapStore()
    session = build_session(cfg, tiers=Tiers(l2, None))
    if reference:
        for cache in session.caches.values():
            assert isinstance(cache, EmbeddingCache)
            cache._kernel = None  # the NumPy reference probe
    for table, (k, v) in data.items():
        l2.insert(table, k, v)
    return session


table_keys = st.lists(st.integers(0, 300), max_size=120)


@SETTINGS
@given(
    stored=st.integers(20, 250),
    threshold=st.sampled_from([0.0, 0.9, 1.0]),
    requests=st.lists(st.tuples(table_keys, table_keys, table_keys), min_size=1, max_size=5),
)
def test_requests_match_the_reference(
    tmp_path_factory: pytest.TempPathFactory,
    stored: int,
    threshold: float,
    requests: list[tuple[list[int], list[int], list[int]]],
) -> None:
    """A whole request through compiled probes (one call for every table) gives what the
    NumPy probe gives table by table: the same rows and the same counters."""
    rng = np.random.default_rng(stored)
    data = {}
    for name, dim in TABLES:
        keys = np.arange(stored, dtype=np.int64) * 2  # odd keys and keys >= 2*stored: misses
        data[name] = (keys, rng.standard_normal((keys.size, dim)).astype(np.float32))
    tmp = tmp_path_factory.mktemp("pipeline")
    fast = _session(tmp, data, threshold)
    ref = _session(tmp, data, threshold, reference=True)
    try:
        for request in requests:
            keys = np.concatenate([np.array(t, dtype=np.int64) for t in request])
            counts = np.array([len(t) for t in request], dtype=np.int32)
            got = fast.lookup_request("demo", keys, counts)
            want = np.concatenate(
                [
                    ref.lookup(name, np.array(t, dtype=np.int64)).ravel()
                    for (name, _), t in zip(TABLES, request, strict=True)
                ]
            )
            np.testing.assert_array_equal(got, want)
            fast.drain()
            ref.drain()
        assert fast.stats()["tables"] == ref.stats()["tables"]
    finally:
        fast.close()
        ref.close()


def test_no_stale_row_under_concurrent_updates(tmp_path: object) -> None:
    """Lookups racing with updates see whole rows of some version, and never an older
    version than the last update that finished before the lookup began."""
    keys = np.arange(0, 200, dtype=np.int64)
    base = {n: (keys, np.zeros((keys.size, d), np.float32)) for n, d in TABLES}
    session = _session(tmp_path, base, 0.0)
    done = threading.Event()
    finished = [0]  # the last version whose update completed
    errors: list[str] = []
    rng = np.random.default_rng(1)

    def reader() -> None:
        while not done.is_set():
            floor = finished[0]
            q = rng.integers(0, 260, 3 * 150)
            out = session.lookup_request("demo", q, np.array([150, 150, 150], np.int32))
            t0 = out[: 150 * 4].reshape(150, 4)
            seen = t0[q[:150] < 200]
            if not (seen == seen[:, :1]).all():
                errors.append("a row mixes versions")
            if seen.size and seen.min() < floor:
                errors.append(f"version {seen.min()} seen after {floor} finished")

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for version in range(1, 60):
            for name, dim in TABLES:
                session.insert(name, keys, np.full((keys.size, dim), version, np.float32))
            finished[0] = version
    finally:
        done.set()
        for t in threads:
            t.join()
    session.drain()
    final = session.lookup_request("demo", np.tile(keys, 3), np.full(3, keys.size, np.int32))
    session.close()
    assert not errors, errors[:3]
    np.testing.assert_array_equal(final, 59.0)


def test_one_table_is_the_request_pipeline_with_one_table(tmp_path: object) -> None:
    """lookup(table) and lookup_request take the same way: same rows, same counters."""
    keys = np.arange(0, 100, dtype=np.int64)
    data = {n: (keys, np.full((keys.size, d), 7.0, np.float32)) for n, d in TABLES}
    one, whole = _session(tmp_path, data, 0.5), _session(tmp_path, data, 0.5)
    q = np.array([3, 150, 3, 99, 7, 150], np.int64)
    try:
        for _ in range(2):  # misses, then L1 hits
            got = one.lookup("demo.t1", q)
            want = whole.lookup_request("demo", q, np.array([0, q.size, 0], np.int32))
            np.testing.assert_array_equal(got.ravel(), want)
        assert one.stats()["tables"] == whole.stats()["tables"]
        assert one.stats()["tables"]["demo.t1"]["l1"] == 3  # 3, 7, 99 on the second pass
    finally:
        one.close()
        whole.close()


def test_the_session_is_whole_when_built(tmp_path: object) -> None:
    """Its L1 caches are given at construction and cannot be swapped afterwards."""
    session = _session(tmp_path, {}, 0.0)
    try:
        assert sorted(session.caches) == [name for name, _ in TABLES]
        with pytest.raises(TypeError):
            session.caches["demo.t0"] = session.caches["demo.t1"]  # type: ignore[index]
    finally:
        session.close()
