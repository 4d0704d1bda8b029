"""The many-table probe (hps.cache.many) against ``query_into`` per table, on twin caches:
same rows, same miss positions and hits, same cache state afterwards, for every policy, with
duplicates, misses, reserved keys, index arrays replaced between calls (a rehash), tables of
different row formats and of every tile width in one call, gaps between their rows.

On every usable array module: NumPy here (the compiled CPU kernels); on CuPy, where a GPU is
lent (``make gpu-check``), one ``probe_gather_tables`` launch on the GPU's shared device
against a GPU probe per table, the rows into a host buffer or into one on the GPU. The same
cases run on the kernels' CUDA source built for the CPU (test_kernel_cuda_source.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hps.cache.embedding_cache import EmbeddingCache
from hps.cache.many import one_gpu, probe_tables, query_tables_into
from hps.cache.xp import available_xps, to_host
from hps.rowformat import FORMATS, ROW_DTYPES
from hps.types import ArrayModule
from tests.unit.cache.test_fused_property import SETTINGS, _same_state, keys_st

GAP = 3  # floats between two tables' rows in the many-table call's output
XPS = available_xps()

# Row widths of every tile (kernels_cupy.tile_for: 8 lanes up to dim 32, 16 up to 64, a
# warp beyond), 256 and 257 among them.
DIMS = st.one_of(
    st.integers(1, 9), st.integers(33, 64), st.integers(65, 130), st.sampled_from([256, 257])
)


def twins(
    policy: str, dims: list[int], capacity: int, row_dtypes: list[str], xp: ArrayModule = np
) -> tuple[list[EmbeddingCache], ...]:
    def make() -> list[EmbeddingCache]:
        return [
            EmbeddingCache(d, capacity, xp=xp, policy=policy, frequency_window=50, fmt=FORMATS[r])
            for d, r in zip(dims, row_dtypes, strict=False)
        ]

    return make(), make()


@pytest.mark.parametrize("xp", XPS, ids=[m.__name__ for m in XPS])
@SETTINGS
@given(
    policy=st.sampled_from(["lru", "lfu", "frequency"]),
    dims=st.lists(DIMS, min_size=1, max_size=4),
    capacity=st.integers(1, 120),
    resident=st.lists(st.integers(-50, 400), max_size=200),
    rounds=st.lists(st.lists(keys_st, min_size=4, max_size=4), min_size=1, max_size=3),
    row_dtypes=st.lists(st.sampled_from(ROW_DTYPES), min_size=4, max_size=4),
    on_device=st.booleans(),
    first=st.integers(0, 3),
)
def test_many_tables_match_query_into_per_table(
    xp: ArrayModule,
    policy: str,
    dims: list[int],
    capacity: int,
    resident: list[int],
    rounds: list[list[list[int]]],
    row_dtypes: list[str],
    on_device: bool,
    first: int,
) -> None:
    """``on_device``: on a GPU, the rows into a buffer there (NumPy has none)."""
    many, single = twins(policy, dims, capacity, row_dtypes, xp)
    match_many(many, single, resident, rounds, on_device=on_device and xp is not np, first=first)


def match_many(
    many: list[EmbeddingCache],
    single: list[EmbeddingCache],
    resident: list[int],
    rounds: list[list[list[int]]],
    *,
    on_device: bool = False,
    first: int = 0,
) -> None:
    """Fill both sets of caches with ``resident``; then per round one many-table call over
    ``many`` against ``query_into`` per table of ``single`` (new index arrays behind the
    caches before the second round): the same rows, misses, hits and states.

    The rows go into a host buffer, or with ``on_device`` into one of ``many[0]``'s device
    (``out_on_device``: the caches' GPU, or an emulated one's host memory), from element
    ``first`` (unaligned unless 0), ``GAP`` floats between tables: nothing may write there."""
    dims = [cache.dim for cache in many]
    res = np.array(resident, dtype=np.int64)
    for t, dim in enumerate(dims):
        rows = np.random.default_rng(t).standard_normal((res.size, dim)).astype(np.float32)
        vals = many[t].fmt.encode(rows)
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
                cache.insert(
                    fresh, cache.fmt.encode(np.ones((5, cache.dim), np.float32)), force=True
                )
            segs = [np.concatenate([seg, fresh]) for seg in segs]
        used = [t for t, seg in enumerate(segs) if seg.size]
        starts = np.cumsum([0] + [segs[t].size for t in used])
        keys = np.concatenate([segs[t] for t in used] or [np.zeros(0, np.int64)])
        offsets = first + np.cumsum([0] + [segs[t].size * dims[t] + GAP for t in used])
        device = on_device and bool(used)  # no table, no device: the host answers nothing
        lead = many[used[0] if used else 0]
        with lead._scope:
            out = (lead.xp if device else np).full(int(offsets[-1]), np.nan, np.float32)
        bounds = np.stack([starts[:-1], starts[1:]], axis=1).astype(np.int64)
        got = query_tables_into(
            [many[t] for t in used], keys, bounds, out, offsets[:-1], out_on_device=device
        )
        assert got is not None
        out = to_host(out)
        assert np.isnan(out[:first]).all()
        for i, t in enumerate(used):
            want = np.full((segs[t].size, dims[t]), np.nan, np.float32)
            miss, hits = single[t].query_into(segs[t], want)
            got_rows = out[offsets[i] : offsets[i + 1] - GAP]
            assert np.isnan(out[offsets[i + 1] - GAP : offsets[i + 1]]).all()
            np.testing.assert_array_equal(
                got_rows.view(np.uint32), want.reshape(-1).view(np.uint32)
            )
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


def test_rows_on_a_device_need_caches_on_one_gpu() -> None:
    """Caches on NumPy cannot write into a GPU buffer: no one-call answer, and the pipeline's
    probe refuses rather than writing host rows somewhere else."""
    cache = EmbeddingCache(4, 10)
    keys = np.arange(3, dtype=np.int64)
    out = np.empty(12, np.float32)
    bounds, offsets = np.array([[0, 3]], np.int64), np.zeros(1, np.int64)
    assert one_gpu([cache]) is None and one_gpu([]) is None
    assert query_tables_into([cache], keys, bounds, out, offsets, out_on_device=True) is None
    with pytest.raises(ValueError, match="one GPU"):
        probe_tables([cache], [4], keys, bounds, out, offsets, out_on_device=True)
