"""Each policy's eviction order, the frequency policy's admission and hot set, and sizing."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from hps.cache import MIN_CAPACITY, EmbeddingCache, build_cache, cache_capacity, cache_nbytes
from hps.cache.policies import policy_nbytes
from hps.cache.rows import rows_nbytes
from hps.cache.writelog import writelog_nbytes
from hps.config import CacheConfig, parse_config
from hps.errors import ConfigError, DTypeError, ShapeError
from hps.rowformat import FLOAT32, FORMATS, RowFormat
from hps.types import TableSpec


def k(*keys: int) -> np.ndarray:
    return np.array(keys, dtype=np.int64)


def v(keys: np.ndarray, dim: int = 2, fmt: RowFormat = FLOAT32) -> np.ndarray:
    """Stored rows (``fmt``) whose every element is the key (small keys: exact in all)."""
    return fmt.encode(np.repeat(keys.astype(np.float32)[:, None], dim, axis=1))


def fill(cache: EmbeddingCache, *keys: int) -> None:
    cache.insert(k(*keys), v(k(*keys), cache.dim, cache.fmt))


def resident(cache: EmbeddingCache) -> set[int]:
    return set(cache.resident_keys().tolist())


def test_lru_evicts_the_least_recently_used(xp: ModuleType) -> None:
    cache = EmbeddingCache(2, 3, xp=xp, policy="lru")
    for key in (1, 2, 3):
        fill(cache, key)
    cache.query(k(1))  # order now (oldest first): 2, 3, 1
    fill(cache, 4)
    assert resident(cache) == {1, 3, 4}
    fill(cache, 5)
    assert resident(cache) == {1, 4, 5}


def test_lfu_evicts_the_least_frequently_used(xp: ModuleType) -> None:
    cache = EmbeddingCache(2, 3, xp=xp, policy="lfu")
    for key in (1, 2, 3):
        fill(cache, key)
    for _ in range(3):
        cache.query(k(1))
    cache.query(k(3))
    fill(cache, 4)  # 2 was used least
    assert resident(cache) == {1, 3, 4}
    cache.query(k(4))
    cache.query(k(4))
    fill(cache, 5)  # counts: 1 -> 4, 3 -> 2, 4 -> 3
    assert resident(cache) == {1, 4, 5}


def test_lfu_counts_every_access_of_a_request(xp: ModuleType) -> None:
    cache = EmbeddingCache(2, 2, xp=xp, policy="lfu")
    fill(cache, 1)
    fill(cache, 2)
    request = k(1, 2, 2, 2)
    uniq, inverse = np.unique(request, return_inverse=True)
    cache.query(uniq, inverse)
    fill(cache, 3)
    assert resident(cache) == {2, 3}


def test_lfu_counts_stop_at_their_cap_on_every_path(xp: ModuleType) -> None:
    """A count at the int32 cap stays there (it once wrapped negative on the NumPy path,
    which made the hottest row the first to be evicted); compiled and reference alike."""
    for compiled in (True, False):
        cache = EmbeddingCache(2, 4, xp=xp, policy="lfu")
        if not compiled:
            cache._kernel = None
        fill(cache, 1, 2)
        counts, cap = cache.policy.access_counts()  # type: ignore[misc]
        counts[:] = cap - 2
        cache.query_into(k(1, 1, 1, 2), np.empty((4, 2), np.float32))
        cache.query(k(1, 2), np.array([0, 0, 1]))
        rows = cache._rows.lookup(xp.asarray(k(1, 2)))
        assert counts[rows].tolist() == [cap, cap], compiled
        fill(cache, 3, 4)
        fill(cache, 5)  # evicts 3 or 4 (count 1), never the saturated 1 and 2
        assert {1, 2} <= resident(cache)


def test_frequency_turns_away_a_rare_key_and_admits_a_frequent_one(xp: ModuleType) -> None:
    cache = EmbeddingCache(2, 2, xp=xp, policy="frequency", static_fraction=0.0)
    fill(cache, 1, 2)
    for _ in range(3):
        cache.query(k(1, 2))
    _, hit = cache.query(k(9))
    assert not hit.any()
    fill(cache, 9)  # asked for once; the residents three times each
    assert resident(cache) == {1, 2}
    assert cache.stats()["rejected"] == 1
    for _ in range(5):
        cache.query(k(9))
    fill(cache, 9)  # now asked for more often than either resident
    assert 9 in resident(cache) and len(resident(cache)) == 2


def test_forced_inserts_bypass_admission(xp: ModuleType, fmt: RowFormat) -> None:
    cache = EmbeddingCache(2, 2, xp=xp, fmt=fmt, policy="frequency", static_fraction=0.0)
    fill(cache, 1, 2)
    for _ in range(3):
        cache.query(k(1, 2))
    cache.insert(k(9), v(k(9), fmt=fmt), force=True)  # prefetch / warm-up
    assert 9 in resident(cache)


def test_pinned_rows_are_never_evicted(xp: ModuleType, fmt: RowFormat) -> None:
    for policy in ("lru", "lfu", "frequency"):
        cache = EmbeddingCache(2, 4, xp=xp, fmt=fmt, policy=policy, static_fraction=0.5)
        cache.pin(k(1, 2, 3), v(k(1, 2, 3), fmt=fmt))  # only two fit in the pinned set
        assert set(cache.pinned_keys().tolist()) == {1, 2} and 3 in resident(cache)
        for batch in range(10, 60, 3):
            more = k(batch, batch + 1, batch + 2)
            cache.insert(more, v(more, fmt=fmt), force=True)
            assert {1, 2} <= resident(cache)
        cache.evict(k(1))  # explicit removal (a delete) still works
        assert 1 not in resident(cache) and cache.n_pinned == 1
        values, hit = cache.query(k(2))
        assert hit.all() and (values == 2.0).all()


def test_frequency_repins_the_hot_set_each_window(xp: ModuleType) -> None:
    cache = EmbeddingCache(2, 4, xp=xp, policy="frequency", static_fraction=0.5, frequency_window=8)
    cache.pin(k(1, 2), v(k(1, 2)))
    fill(cache, 3, 4)
    for _ in range(4):  # 8 accesses: one window; only 3 and 4 were used in it
        cache.query(k(3, 4))
    assert set(cache.pinned_keys().tolist()) == {3, 4}
    assert resident(cache) == {1, 2, 3, 4}  # unpinned, not evicted


def test_a_whole_static_fraction_still_leaves_rows_to_evict(xp: ModuleType) -> None:
    """``static_fraction: 1.0``: a window re-pins the rows it used, but a sixteenth of the
    rows stays evictable, so new keys still get in (all 100 rows pinned turned away every
    insert, forced ones too, until the next window)."""
    cache = EmbeddingCache(
        2, 100, xp=xp, policy="frequency", static_fraction=1.0, frequency_window=1000
    )
    old, new = np.arange(100, dtype=np.int64), np.arange(1000, 1100, dtype=np.int64)
    cache.insert(old, v(old), force=True)
    for _ in range(10):  # 1,000 accesses: a window ends and re-pins what it used
        cache.query(old)
    assert cache.max_pinned == cache.n_pinned == 100 - 100 // 16
    cache.insert(new, v(new), force=True)  # a prefetch
    assert int(cache.resident(new).sum()) == 100 // 16
    assert EmbeddingCache(2, 1, xp=xp, static_fraction=1.0).max_pinned == 0


def test_frequency_follows_a_moving_hot_set(xp: ModuleType, fmt: RowFormat) -> None:
    capacity, window = 50, 400
    cache = EmbeddingCache(2, capacity, xp=xp, fmt=fmt, policy="frequency", frequency_window=window)
    zeros = fmt.encode(np.zeros((capacity, 2), dtype=np.float32))
    for hot in (np.arange(0, 50), np.arange(1000, 1050)):
        hits = []
        for _ in range(40):
            _, hit = cache.query(hot)
            hits.append(hit.mean())
            miss = hot[~hit]
            cache.insert(miss, zeros[: miss.size])
        assert hits[-1] == 1.0


def test_full_capacity_reaches_a_100_percent_hit_rate(xp: ModuleType, fmt: RowFormat) -> None:
    rng = np.random.default_rng(3)
    keys = rng.choice(1 << 50, 5000, replace=False).astype(np.int64)
    stored = fmt.encode(rng.standard_normal((keys.size, 4)).astype(np.float32))
    for policy in ("lru", "lfu", "frequency"):
        cache = EmbeddingCache(4, keys.size, xp=xp, policy=policy, fmt=fmt)
        for chunk in np.array_split(rng.permutation(keys.size), 7):
            cache.insert(keys[chunk], stored[chunk])
        assert len(cache) == keys.size
        order = np.argsort(keys)
        values, hit = cache.query(keys[order])
        assert hit.all()
        np.testing.assert_array_equal(values, fmt.decode(stored[order], 4))


def test_more_new_keys_than_capacity_keeps_what_fits(xp: ModuleType, fmt: RowFormat) -> None:
    cache = EmbeddingCache(2, 5, xp=xp, fmt=fmt, policy="lru")
    keys = np.arange(100, 120, dtype=np.int64)
    cache.insert(keys, v(keys, fmt=fmt))
    assert len(cache) == 5 and resident(cache) <= set(keys.tolist())


def test_reserved_keys_are_not_cached(xp: ModuleType, fmt: RowFormat) -> None:
    cache = EmbeddingCache(2, 4, xp=xp, fmt=fmt)
    reserved = np.iinfo(np.int64).min
    cache.insert(np.array([reserved, 5], dtype=np.int64), fmt.encode(np.ones((2, 2), np.float32)))
    assert resident(cache) == {5}
    _, hit = cache.query(np.array([reserved, reserved + 1], dtype=np.int64))
    assert not hit.any()


def test_bad_input_is_refused_and_nothing_changes(xp: ModuleType, fmt: RowFormat) -> None:
    cache = EmbeddingCache(2, 4, xp=xp, fmt=fmt)
    fill(cache, 1)
    with pytest.raises(ShapeError, match=f"expected {fmt.name} rows"):
        cache.insert(k(2, 3), np.ones((2, cache.width + 1), fmt.dtype))
    with pytest.raises(ShapeError):
        cache.update(k(1), np.ones((2, cache.width), fmt.dtype))
    with pytest.raises(DTypeError, match="int64"):
        cache.query(np.array([1.5]))
    with pytest.raises(ShapeError, match="C-contiguous"):
        cache.query_into(k(1, 2), np.zeros((2, 4), np.float32)[:, ::2])
    assert resident(cache) == {1}
    values, _ = cache.query(k(1))
    np.testing.assert_array_equal(values, FLOAT32.encode(np.ones((1, 2), np.float32)))


def test_nbytes_matches_the_sizing_formula(xp: ModuleType, fmt: RowFormat) -> None:
    for policy in ("lru", "lfu", "frequency"):
        for capacity, dim in ((1, 1), (1000, 16), (4097, 128)):
            cache = EmbeddingCache(dim, capacity, xp=xp, policy=policy, fmt=fmt)
            assert cache.nbytes == cache_nbytes(capacity, dim, policy, fmt)
            if fmt is not FLOAT32:
                arena = capacity * (4 * dim - fmt.row_bytes(dim))
                assert cache_nbytes(capacity, dim, policy) - cache.nbytes == arena
    # The write log's rings are counted: allocated once, whatever is written.
    cache = EmbeddingCache(1, 1 << 17, xp=xp, fmt=fmt)
    rows, policy = rows_nbytes(1 << 17, 1, fmt), policy_nbytes("lru", 1 << 17)
    assert cache.nbytes - rows - policy == writelog_nbytes(1 << 17) == 12 * (1 << 17)
    for key in range(300):
        cache.update(k(key), v(k(key), 1, fmt))
    assert cache.nbytes == cache_nbytes(1 << 17, 1, "lru", fmt)


def test_cache_capacity_and_build_cache(tmp_path: object) -> None:
    doc = {
        "models": [
            {"model": "m", "embedding_vecsize_per_table": [8], "gpucacheper": 0.5},
            {"model": "n", "embedding_vecsize_per_table": [8], "hps_cache": {"capacity": 77}},
            {"model": "o", "embedding_vecsize_per_table": [8], "gpucache": False},
        ]
    }
    m, n, o = parse_config(doc).models
    assert cache_capacity(m, 100_000) == 50_000
    assert cache_capacity(m, 10) == MIN_CAPACITY
    assert cache_capacity(n, 100_000) == 77
    assert cache_capacity(o, 100_000) == 0
    assert cache_capacity(m, 5 * 2**31) == 2**31 - 1  # the index's rows are int32
    with pytest.raises(ConfigError, match="less than or equal to 2147483647"):
        parse_config({"models": [{"model": "p", "embedding_vecsize_per_table": [8],
                                  "hps_cache": {"capacity": 3_000_000_000}}]})  # fmt: skip
    spec = TableSpec("m", "t", 8)
    cache = build_cache(spec, CacheConfig(policy="lfu", device="numpy"), 10)
    assert (cache.capacity, cache.dim, cache.policy.name, cache.xp) == (10, 8, "lfu", np)
    with pytest.raises(ConfigError, match="at least 1 row"):
        build_cache(spec, CacheConfig(), 0)
    for fmt in FORMATS.values():  # the table's row format
        table = TableSpec("m", "t", 8, row_dtype=fmt.name)
        cache = build_cache(table, CacheConfig(device="numpy"), 4)
        assert cache.fmt is fmt and cache._rows.values.shape == (4, fmt.width(8))
        assert cache._rows.values.dtype == fmt.dtype
