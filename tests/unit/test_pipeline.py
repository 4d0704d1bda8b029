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
from hps.errors import InvalidValueError
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


# -- row formats (docs/config.md: hps_row_dtype) -------------------------------------------

FORMATS = (("q.f32", "float32", 4), ("q.f16", "float16", 8), ("q.i8", "int8", 5))


def _formats_session(tmp_path: object, *, reference: bool = False) -> LookupSession:
    """One cached table per row format over an in-memory L2 and an in-memory "L3"."""
    cfg = make_config(
        tmp_path,
        models=[
            {
                "model": "q",
                "embedding_table_names": [n.split(".")[1] for n, _, _ in FORMATS],
                "embedding_vecsize_per_table": [d for *_, d in FORMATS],
                "hps_row_dtype": [f for _, f, _ in FORMATS],
                "default_value_for_each_table": [0.5, -1.0, 2.0],
                "max_batch_size": 1024,
                "gpucache": True,
                "hit_rate_threshold": 0.0,
                "hps_cache": {"capacity": 64, "device": "numpy"},
            }
        ],
        volatile_db={"type": "hash_map", "cache_missed_embeddings": True},
        persistent_db={"type": "disabled"},
    )
    session = build_session(cfg, tiers=Tiers(HashMapStore(), HashMapStore()))
    if reference:
        for cache in session.caches.values():
            assert isinstance(cache, EmbeddingCache)
            cache._kernel = None
    return session


def _source(dim: int, n: int = 40, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed + dim)
    keys = np.arange(n, dtype=np.int64) * 7 + 1
    return keys, (rng.standard_normal((n, dim)) * 3).astype(np.float32)


@pytest.mark.parametrize("reference", [False, True], ids=["compiled", "numpy"])
def test_formats_answer_float32_as_stored_from_every_level(
    tmp_path: object, reference: bool
) -> None:
    """Rows written through the session are stored encoded; a lookup answers them decoded,
    the same from L2 (decoded by the pipeline) as from L1 (decoded by its kernel), within
    each format's bound of the float32 source, and the default where no level holds a key."""
    session = _formats_session(tmp_path, reference=reference)
    try:
        data = {name: _source(dim) for name, _, dim in FORMATS}
        for name, (keys, values) in data.items():
            session.insert(name, keys, values)
        q_keys = [np.concatenate([k[::3], [999_999], k[::3]]) for k, _ in data.values()]
        counts = np.array([q.size for q in q_keys], np.int32)
        first = session.lookup_request("q", np.concatenate(q_keys), counts)  # L2
        session.drain()
        again = session.lookup_request("q", np.concatenate(q_keys), counts)  # L1
        np.testing.assert_array_equal(again, first)
        stats = session.stats()["tables"]
        assert all(stats[n]["l1"] == data[n][0][::3].size for n, *_ in FORMATS)
        at = 0
        for (name, fmt_name, dim), q in zip(FORMATS, q_keys, strict=True):
            spec = session.tables[name]
            got = first[at : at + q.size * dim].reshape(q.size, dim)
            at += q.size * dim
            keys, values = data[name]
            src = values[np.searchsorted(keys, q[q != 999_999])]
            served = got[q != 999_999]
            np.testing.assert_array_equal(served, spec.fmt.decode(spec.fmt.encode(src), dim))
            err = np.abs(served - src)
            if fmt_name == "float16":
                assert (err <= np.abs(src) * 2.0**-11 + 1e-7).all()
            elif fmt_name == "int8":
                half_step = (src.max(axis=1) - src.min(axis=1)) / 510
                ulps = 4 * np.spacing(np.abs(src).max(axis=1))  # float32 rounding of decode
                assert (err <= (half_step + ulps)[:, None]).all()
            np.testing.assert_array_equal(got[q == 999_999], spec.default_value)
    finally:
        session.close()


def test_rows_move_between_tiers_as_stored(tmp_path: object) -> None:
    """L3 hits go to L2 and L1 byte for byte as stored: nothing is re-quantized."""
    session = _formats_session(tmp_path)
    try:
        for name, _, dim in FORMATS:
            spec = session.tables[name]
            keys, values = _source(dim)
            stored = spec.fmt.encode(values)
            assert session.tiers.persistent is not None and session.tiers.volatile is not None
            session.tiers.persistent.insert(name, keys, stored)
            got = session.lookup(name, keys)  # L3 → the answer, L2 and L1
            session.drain()
            np.testing.assert_array_equal(got, spec.fmt.decode(stored, dim))
            in_l2, found = session.tiers.volatile.fetch(name, keys)
            assert found.all() and in_l2.dtype == spec.fmt.dtype
            np.testing.assert_array_equal(in_l2, stored)
            cache = session.caches[name]
            assert isinstance(cache, EmbeddingCache)
            l1_keys, l1_rows = cache.dump()
            assert l1_rows.dtype == spec.fmt.dtype and l1_rows.shape[1] == spec.width
            order = np.argsort(np.asarray(l1_keys))
            at = np.searchsorted(keys, np.asarray(l1_keys)[order])
            np.testing.assert_array_equal(np.asarray(l1_rows)[order], stored[at])
    finally:
        session.close()


def test_float16_out_of_range_is_refused_and_nothing_is_written(tmp_path: object) -> None:
    session = _formats_session(tmp_path)
    try:
        keys = np.array([1, 2], np.int64)
        bad = np.array([[1.0] * 8, [7e4] + [0.0] * 7], np.float32)
        with pytest.raises(InvalidValueError, match=r"q\.f16: .*float16"):
            session.insert("q.f16", keys, bad)
        assert session.stats()["tables"]["q.f16"]["keys"] == 0
        np.testing.assert_array_equal(session.lookup("q.f16", keys), -1.0)  # defaults
        session.insert("q.i8", keys, np.array([[7e4] * 5, [-7e4] * 5], np.float32))  # fine
    finally:
        session.close()


def test_fills_wait_within_a_byte_budget_and_past_it_are_dropped(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hps import pipeline

    keys = np.arange(0, 100, dtype=np.int64)
    data = {n: (keys, np.full((keys.size, d), 7.0, np.float32)) for n, d in TABLES}
    session = _session(tmp_path, data, 0.0)  # threshold 0: L1 fills in the background
    monkeypatch.setattr(pipeline, "MAX_BACKGROUND_BYTES", 2000)
    gate = threading.Event()
    try:
        session.pipeline.background("test", gate.wait)  # the worker is busy: fills wait
        q = np.arange(0, 20, dtype=np.int64)  # 20 keys of dim 8: 160 + 640 bytes a fill
        for _ in range(3):
            got = session.lookup("demo.t1", q)  # answered from L2 all the same
            np.testing.assert_array_equal(got, np.full((20, 8), 7.0))
        assert session.stats()["background_dropped"] == 1  # the third: 2,400 > 2,000
        gate.set()
        session.drain()
        cache = session.caches["demo.t1"]
        assert cache.resident(q).all()  # the two that waited were applied
        assert session.pipeline._queued_bytes == 0
    finally:
        gate.set()
        session.close()
