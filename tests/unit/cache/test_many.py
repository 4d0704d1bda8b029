"""The many-table probe (hps.cache.many) against ``query_into`` per table, on twin caches:
same rows, same miss positions and hits, same cache state afterwards, for every policy, with
duplicates, misses, reserved keys, and index arrays replaced between calls (a rehash)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from hps.cache.embedding_cache import EmbeddingCache
from hps.cache.many import query_tables_into
from tests.unit.cache.test_fused_property import SETTINGS, _same_state, keys_st


def twins(policy: str, dims: list[int], capacity: int) -> tuple[list[EmbeddingCache], ...]:
    def make() -> list[EmbeddingCache]:
        return [EmbeddingCache(d, capacity, policy=policy, frequency_window=50) for d in dims]

    return make(), make()


@SETTINGS
@given(
    policy=st.sampled_from(["lru", "lfu", "frequency"]),
    dims=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    capacity=st.integers(1, 120),
    resident=st.lists(st.integers(-50, 400), max_size=200),
    rounds=st.lists(st.lists(keys_st, min_size=4, max_size=4), min_size=1, max_size=3),
)
def test_many_tables_match_query_into_per_table(
    policy: str, dims: list[int], capacity: int, resident: list[int], rounds: list[list[list[int]]]
) -> None:
    many, single = twins(policy, dims, capacity)
    res = np.array(resident, dtype=np.int64)
    for t, dim in enumerate(dims):
        vals = np.random.default_rng(t).standard_normal((res.size, dim)).astype(np.float32)
        many[t].insert(res, vals, force=True)
        single[t].insert(res, vals, force=True)
    for n, round_keys in enumerate(rounds):
        segs = [np.array(k, dtype=np.int64) for k in round_keys[: len(dims)]]
        if n == 1:  # new index arrays behind the caches, then rows only they know
            fresh = np.arange(500, 505, dtype=np.int64)
            for cache in (*many, *single):
                old = cache._rows.index.slot_keys
                cache._rows.index._rehash(len(cache._rows.index))
                assert cache._rows.index.slot_keys is not old
                cache.insert(fresh, np.ones((5, cache.dim), np.float32), force=True)
            segs = [np.concatenate([seg, fresh]) for seg in segs]
        used = [t for t, seg in enumerate(segs) if seg.size]
        starts = np.cumsum([0] + [segs[t].size for t in used])
        keys = np.concatenate([segs[t] for t in used] or [np.zeros(0, np.int64)])
        offsets = np.cumsum([0] + [segs[t].size * dims[t] for t in used])
        out = np.full(int(offsets[-1]), np.nan, np.float32)
        bounds = np.stack([starts[:-1], starts[1:]], axis=1).astype(np.int64)
        got = query_tables_into([many[t] for t in used], keys, bounds, out, offsets[:-1])
        assert got is not None
        for i, t in enumerate(used):
            want = np.full((segs[t].size, dims[t]), np.nan, np.float32)
            miss, hits = single[t].query_into(segs[t], want)
            np.testing.assert_array_equal(out[offsets[i] : offsets[i + 1]], want.reshape(-1))
            np.testing.assert_array_equal(got[i][0], miss)
            assert got[i][1] == hits
        for a, b in zip(many, single, strict=True):
            _same_state(a, b)


def test_a_cache_off_the_compiled_cpu_path_means_none() -> None:
    cache = EmbeddingCache(4, 10)
    cache._kernel = None  # the NumPy reference path
    keys = np.arange(3, dtype=np.int64)
    out = np.empty(12, np.float32)
    bounds = np.array([[0, 3]], np.int64)
    assert query_tables_into([cache], keys, bounds, out, np.zeros(1, np.int64)) is None
    assert query_tables_into([object()], keys, bounds, out, np.zeros(1, np.int64)) is None
