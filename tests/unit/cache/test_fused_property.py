"""Property tests: the compiled probe fused with the gather against the NumPy reference.

The reference is ``EmbeddingCache.query`` of de-duplicated keys (which decodes with
``RowFormat.decode``). Random tables, duplicates, misses, reserved keys, every policy and
row format; the rows must be equal bit for bit (the kernel's dequantization rounds as
``decode`` does). The lookup pipeline over such caches (whole requests
against the reference, updates racing lookups) is tests/unit/test_pipeline.py.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hps.cache.embedding_cache import EmbeddingCache
from hps.cache.kernels import kernel_for
from hps.cache.xp import to_host
from hps.index import EMPTY, TOMBSTONE
from hps.rowformat import FORMATS, ROW_DTYPES

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_the_compiled_kernel_is_there() -> None:
    # numba comes with the triton (serving) and dev extras: without it this file compares
    # the reference with itself.
    assert kernel_for(np) is not None


def _pair(
    policy: str, dim: int, capacity: int, row_dtype: str = "float32"
) -> tuple[EmbeddingCache, EmbeddingCache]:
    fmt = FORMATS[row_dtype]
    fast = EmbeddingCache(dim, capacity, policy=policy, frequency_window=50, fmt=fmt)
    ref = EmbeddingCache(dim, capacity, policy=policy, frequency_window=50, fmt=fmt)
    ref._kernel = None  # the NumPy reference path
    return fast, ref


def _same_state(a: EmbeddingCache, b: EmbeddingCache) -> None:
    """The same stats, ticks, pinned rows, counts and sketch (caches on any array module:
    a GPU cache may have a NumPy twin)."""
    stats = [{**cache.stats(), "device": ""} for cache in (a, b)]
    assert stats[0] == stats[1]
    pairs = [(a._rows.ticks, b._rows.ticks), (a._rows.pinned, b._rows.pinned)]
    if hasattr(a.policy, "counts"):
        pairs.append((a.policy.counts, b.policy.counts))
    if hasattr(a.policy, "sketch"):
        pairs.append((a.policy.sketch.table, b.policy.sketch.table))
    for x, y in pairs:
        np.testing.assert_array_equal(to_host(x), to_host(y))


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
    row_dtype=st.sampled_from(ROW_DTYPES),
)


@SETTINGS
@CACHE_CASES
def test_query_into_matches_the_reference(
    policy: str,
    dim: int,
    capacity: int,
    resident: list[int],
    queries: list[list[int]],
    row_dtype: str,
) -> None:
    fast, ref = _pair(policy, dim, capacity, row_dtype)
    match_the_reference(fast, ref, resident, queries)


def match_the_reference(
    fast: EmbeddingCache, ref: EmbeddingCache, resident: list[int], queries: list[list[int]]
) -> None:
    """Fill both caches with ``resident``, then for each query: the same rows, misses,
    distinct hits and state from ``fast.query_into`` as from ``ref``'s; the misses then go
    in to both, as a lookup would do, and the caches must stay alike."""
    dim, fmt = fast.dim, fast.fmt
    res = np.array(resident, dtype=np.int64)
    vals = fmt.encode(np.random.default_rng(0).standard_normal((res.size, dim)).astype(np.float32))
    for cache in (fast, ref):
        cache.insert(res, vals, force=True)
    for q in queries:
        keys = np.array(q, dtype=np.int64)
        out_f = np.full((keys.size, dim), np.nan, np.float32)
        out_r = np.full((keys.size, dim), np.nan, np.float32)
        miss_f, hit_f = fast.query_into(keys, out_f)
        miss_r, hit_r = ref.query_into(keys, out_r)
        np.testing.assert_array_equal(out_f.view(np.uint32), out_r.view(np.uint32))
        np.testing.assert_array_equal(miss_f, miss_r)
        assert hit_f == hit_r
        _same_state(fast, ref)
        missed = np.unique(keys[miss_f])
        missed = missed[missed > TOMBSTONE]
        fill = fmt.encode(np.ones((missed.size, dim), np.float32))
        fast.insert(missed, fill)
        ref.insert(missed, fill)
        _same_state(fast, ref)
