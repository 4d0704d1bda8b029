"""Property tests: the compiled probe+gather and the fused request path against the reference.

The reference is the NumPy path: ``EmbeddingCache.query`` of de-duplicated keys, and
``LookupSession`` looking tables up one by one. Random tables, duplicates, misses, reserved
keys, every policy, and updates running concurrently with lookups.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hps.build import build_session
from hps.cache.embedding_cache import EmbeddingCache
from hps.cache.kernels import kernel_for
from hps.index import EMPTY, TOMBSTONE
from hps.lookup import LookupSession
from hps.storage.hash_map import HashMapStore
from hps.tiers import Tiers
from tests.helpers import make_config

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_the_compiled_kernel_is_there() -> None:
    # numba comes with the triton (serving) and dev extras: without it this file compares
    # the reference with itself.
    assert kernel_for(np) is not None


def _pair(policy: str, dim: int, capacity: int) -> tuple[EmbeddingCache, EmbeddingCache]:
    fast = EmbeddingCache(dim, capacity, policy=policy, frequency_window=50)
    ref = EmbeddingCache(dim, capacity, policy=policy, frequency_window=50)
    ref._kernel = None  # the NumPy reference path
    return fast, ref


def _same_state(a: EmbeddingCache, b: EmbeddingCache) -> None:
    assert a.stats() == b.stats()
    np.testing.assert_array_equal(a._rows.ticks, b._rows.ticks)
    np.testing.assert_array_equal(a._rows.pinned, b._rows.pinned)
    for name in ("counts",):
        if hasattr(a.policy, name):
            np.testing.assert_array_equal(getattr(a.policy, name), getattr(b.policy, name))
    if hasattr(a.policy, "sketch"):
        np.testing.assert_array_equal(a.policy.sketch.table, b.policy.sketch.table)


keys_st = st.lists(
    st.one_of(st.integers(-50, 400), st.sampled_from([int(EMPTY), int(TOMBSTONE)])),
    min_size=0,
    max_size=300,
)

# A policy, a cache shape, the keys inserted first and a few queries: the cases on which a
# compiled probe must match the NumPy reference (here and in test_kernel_cuda_source.py).
CACHE_CASES = given(
    policy=st.sampled_from(["lru", "lfu", "frequency"]),
    dim=st.integers(1, 9),
    capacity=st.integers(1, 120),
    resident=st.lists(st.integers(-50, 400), max_size=200),
    queries=st.lists(keys_st, min_size=1, max_size=4),
)


@SETTINGS
@CACHE_CASES
def test_query_into_matches_the_reference(
    policy: str, dim: int, capacity: int, resident: list[int], queries: list[list[int]]
) -> None:
    fast, ref = _pair(policy, dim, capacity)
    match_the_reference(fast, ref, resident, queries)


def match_the_reference(
    fast: EmbeddingCache, ref: EmbeddingCache, resident: list[int], queries: list[list[int]]
) -> None:
    """Fill both caches with ``resident``, then for each query: the same rows, misses,
    distinct hits and state from ``fast.query_into`` as from ``ref``'s; the misses then go
    in to both, as a lookup would do, and the caches must stay alike."""
    dim = fast.dim
    res = np.array(resident, dtype=np.int64)
    vals = np.random.default_rng(0).standard_normal((res.size, dim)).astype(np.float32)
    for cache in (fast, ref):
        cache.insert(res, vals, force=True)
    for q in queries:
        keys = np.array(q, dtype=np.int64)
        out_f = np.full((keys.size, dim), np.nan, np.float32)
        out_r = np.full((keys.size, dim), np.nan, np.float32)
        miss_f, hit_f = fast.query_into(keys, out_f)
        miss_r, hit_r = ref.query_into(keys, out_r)
        np.testing.assert_array_equal(out_f, out_r)
        np.testing.assert_array_equal(miss_f, miss_r)
        assert hit_f == hit_r
        _same_state(fast, ref)
        missed = np.unique(keys[miss_f])
        missed = missed[missed > TOMBSTONE]
        fill = np.ones((missed.size, dim), np.float32)
        fast.insert(missed, fill)
        ref.insert(missed, fill)
        _same_state(fast, ref)


def _session(tmp_path: object, data: dict[str, tuple[np.ndarray, np.ndarray]], fuse: bool,
             threshold: float) -> LookupSession:  # fmt: skip
    cfg = make_config(
        tmp_path,
        fuse_embedding_table=fuse,
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
def test_fused_requests_match_the_reference(
    tmp_path_factory: pytest.TempPathFactory,
    stored: int,
    threshold: float,
    requests: list[tuple[list[int], list[int], list[int]]],
) -> None:
    rng = np.random.default_rng(stored)
    data = {}
    for name, dim in (("demo.t0", 4), ("demo.t1", 8), ("demo.t2", 4)):
        keys = np.arange(stored, dtype=np.int64) * 2  # odd keys and keys >= 2*stored: misses
        data[name] = (keys, rng.standard_normal((keys.size, dim)).astype(np.float32))
    tmp = tmp_path_factory.mktemp("fused")
    fused = _session(tmp, data, True, threshold)
    ref = _session(tmp, data, False, threshold)
    assert fused.fused is not None and ref.fused is None
    try:
        for request in requests:
            keys = np.concatenate([np.array(t, dtype=np.int64) for t in request])
            counts = np.array([len(t) for t in request], dtype=np.int32)
            got = fused.lookup_request("demo", keys, counts)
            want = ref.lookup_request("demo", keys, counts)
            np.testing.assert_array_equal(got, want)
            fused.drain()
            ref.drain()
        assert fused.stats()["tables"] == ref.stats()["tables"]
    finally:
        fused.close()
        ref.close()


def test_no_stale_row_under_concurrent_updates(tmp_path: object) -> None:
    """Lookups racing with updates see whole rows of some version, and never an older
    version than the last update that finished before the lookup began."""
    keys = np.arange(0, 200, dtype=np.int64)
    base = {n: (keys, np.zeros((keys.size, d), np.float32))
            for n, d in (("demo.t0", 4), ("demo.t1", 8), ("demo.t2", 4))}  # fmt: skip
    session = _session(tmp_path, base, True, 0.0)
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
            for name, dim in (("demo.t0", 4), ("demo.t1", 8), ("demo.t2", 4)):
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
