"""The GPU kernels' CUDA source, compiled as C++ and run on the CPU with emulated warps.

Most runs get no GPU, so the CUDA kernels would otherwise never run before they reach one.
Here every kernel of :func:`hps.cache.kernels_cupy.kernel_source` runs on the CPU
(tests/unit/cache/cuda_emulation.py: each lane a thread, the 32 lanes of a warp meeting at
each warp intrinsic, real atomics), behind the host path a GPU cache uses (``GpuProbe``,
``run_tables``, ``RowKernels`` on an emulated :class:`~hps.cache.device.Device`), and must
match the NumPy reference exactly: rows, miss positions, distinct hits, ticks, counts and
stats, for every policy, row format and tile width:

- ``probe_gather`` (one table) and ``place_rows`` / ``write_rows`` (inserts, lookups) on the
  property cases of test_fused_property.py;
- ``probe_gather_tables`` (every table of a request in one launch) on those of test_many.py;
- ``write_rows`` as ``update`` (the Kafka refresh), with ``since``, and the index's books
  after placements that reuse tombstones.

What this cannot show (NVRTC's dialect, the GPU's own scheduling) test_kernel_nvrtc.py and
the L1 tests on CuPy where a GPU is lent (conftest.py runs them on every usable module) do.
"""

from __future__ import annotations

import ctypes

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from hps.cache.embedding_cache import EmbeddingCache
from hps.index import TOMBSTONE
from hps.rowformat import FORMATS, ROW_DTYPES, RowFormat
from tests.unit.cache.cuda_emulation import GARBAGE, EmulatedDevice, on_emulated_gpu
from tests.unit.cache.test_fused_property import (
    CACHE_CASES,
    SETTINGS,
    _pair,
    _same_state,
    keys_st,
    match_the_reference,
)
from tests.unit.cache.test_many import DIMS, match_many, twins

TILES = (8, 16, 32)


def _tile(*seeds: int) -> int:
    """A tile width for a case, spread over the three by the case's own numbers."""
    return TILES[sum(seeds) % len(TILES)]


@SETTINGS
@CACHE_CASES
def test_the_cuda_source_matches_the_reference(
    cuda_lib: ctypes.CDLL,
    policy: str,
    dim: int,
    capacity: int,
    resident: list[int],
    queries: list[list[int]],
    row_dtype: str,
) -> None:
    gpu, ref = _pair(policy, dim, capacity, row_dtype)
    device = on_emulated_gpu(gpu, cuda_lib, _tile(dim, capacity))
    match_the_reference(gpu, ref, resident, queries)
    assert device.launches.count("probe_gather") == sum(1 for q in queries if q)


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
def test_the_many_table_kernel_matches_the_reference(
    cuda_lib: ctypes.CDLL,
    policy: str,
    dims: list[int],
    capacity: int,
    resident: list[int],
    rounds: list[list[list[int]]],
    row_dtypes: list[str],
    on_device: bool,
    first: int,
) -> None:
    """One launch per request over caches of different dims (every tile width: the launch
    takes each table's from its dim) and formats, with gaps between their rows in the
    output, which starts unaligned unless ``first`` is 0, a host buffer or (``on_device``)
    the device's own, against the NumPy reference per table. The write kernels' tile is
    forced (``_tile``)."""
    many, single = twins(policy, dims, capacity, row_dtypes)
    device = on_emulated_gpu(many[0], cuda_lib, _tile(capacity))
    for cache in many[1:]:
        on_emulated_gpu(cache, cuda_lib, _tile(capacity), device)
    for cache in single:
        cache._kernel = None
    match_many(many, single, resident, rounds, on_device=on_device, first=first)
    probed = [n == 1 or any(r[: len(dims)]) for n, r in enumerate(rounds)]  # some keys
    assert device.launches.count("probe_gather_tables") == sum(probed)
    assert "probe_gather" not in device.launches


def test_wide_rows_and_many_keys_per_warp_match_the_reference(cuda_lib: ctypes.CDLL) -> None:
    """The dims a config uses (tiles of 8, 16 and 32 lanes, vector copies of every format),
    batches that loop the grid many times, a full cache evicting: as the reference."""
    rng = np.random.default_rng(1)
    for dim, row_dtype in ((16, "int8"), (64, "float16"), (128, "float32")):
        gpu, ref = _pair("frequency", dim, 300, row_dtype)
        on_emulated_gpu(gpu, cuda_lib)
        resident = rng.integers(0, 1500, 600).tolist()
        queries = [rng.integers(-5, 1500, 800).tolist() for _ in range(2)]
        match_the_reference(gpu, ref, resident, queries)


def _index_books_hold(cache: EmbeddingCache) -> None:
    """Every resident key is in the index at its row, and the index's counts are true."""
    rows, index = cache._rows, cache._rows.index
    keys, at = index.items()
    np.testing.assert_array_equal(rows.row_keys[at], keys)
    assert keys.size == len(index) == len(rows)
    assert int((index.slot_keys == TOMBSTONE).sum()) == index._tombs


@SETTINGS
@given(
    policy=st.sampled_from(["lru", "lfu", "frequency"]),
    dim=st.integers(1, 9),
    capacity=st.integers(1, 60),
    batches=st.lists(
        st.tuples(st.sampled_from(["insert", "update", "evict", "stale"]), keys_st),
        min_size=1,
        max_size=8,
    ),
    row_dtype=st.sampled_from(ROW_DTYPES),
)
def test_the_write_kernels_match_the_reference(
    cuda_lib: ctypes.CDLL,
    policy: str,
    dim: int,
    capacity: int,
    batches: list[tuple[str, list[int]]],
    row_dtype: str,
) -> None:
    """Inserts (evicting, reusing tombstones), updates of resident rows (with ``since``:
    a stale read skips keys written after it), evictions: the same stored rows and state."""
    gpu, ref = _pair(policy, dim, capacity, row_dtype)
    on_emulated_gpu(gpu, cuda_lib, _tile(dim, capacity))
    fmt = gpu.fmt
    rng = np.random.default_rng(capacity)
    for op, batch in batches:
        keys = np.array([k for k in batch if k > TOMBSTONE], dtype=np.int64)
        keys = np.unique(keys) if op == "stale" else keys
        values, newer = (
            fmt.encode(rng.standard_normal((keys.size, dim)).astype(np.float32)) for _ in "ab"
        )
        updated = []
        for cache in (gpu, ref):
            since = cache.version
            if op == "stale":  # a write between the read and the update it carries
                cache.insert(keys[::2], newer[::2], force=True)
            if op == "insert":
                cache.insert(keys, values)
            elif op == "evict":
                cache.evict(keys)
            else:
                updated.append(cache.update(keys, values, since=since if op == "stale" else None))
        if updated:
            np.testing.assert_array_equal(updated[0], updated[1])
        _same_state(gpu, ref)
        _index_books_hold(gpu)
        (keys_g, rows_g), (keys_r, rows_r) = gpu.dump(), ref.dump()
        order_g, order_r = np.argsort(keys_g), np.argsort(keys_r)
        np.testing.assert_array_equal(keys_g[order_g], keys_r[order_r])
        np.testing.assert_array_equal(rows_g[order_g], rows_r[order_r])


def test_the_cuda_source_caps_access_counts(cuda_lib: ctypes.CDLL) -> None:
    """LFU counts stop at the policy's cap, as on the CPU: many hits of one row in a call
    (many lanes racing on the count), then the count is exactly the cap."""
    gpu = EmbeddingCache(4, 8, policy="lfu")
    on_emulated_gpu(gpu, cuda_lib)
    gpu.insert(np.array([7], np.int64), np.ones((1, 4), np.float32), force=True)
    counts, cap = gpu.policy.access_counts()  # type: ignore[misc]
    keys = np.full(200, 7, dtype=np.int64)
    counts[:] = cap - 5
    miss, hits = gpu.query_into(keys, np.empty((keys.size, 4), np.float32))
    assert miss.size == 0 and hits == 1
    row = int(gpu._rows.lookup(np.array([7], np.int64))[0])
    assert counts[row] == cap


def test_the_cuda_source_dequantizes_as_decode(cuda_lib: ctypes.CDLL) -> None:
    """float16 (every one of its values) and int8 rows (every alignment of the scale and
    offset, vector and scalar copies) come out of the kernel as ``RowFormat.decode`` gives
    them, bit for bit."""
    fmt16 = FORMATS["float16"]
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).reshape(256, 256)
    cases: list[tuple[RowFormat, np.ndarray]] = [(fmt16, halves)]
    rng = np.random.default_rng(5)
    for dim in (1, 2, 3, 4, 5, 8, 67, 128):
        rows = rng.standard_normal((16, dim)).astype(np.float32) * np.float32(100)
        rows[3] = 1.5  # a constant row: scale 0
        cases.append((FORMATS["int8"], FORMATS["int8"].encode(rows)))
    for fmt, stored in cases:
        n, dim = stored.shape[0], stored.shape[1] - (fmt.width(0))
        gpu = EmbeddingCache(dim, n, fmt=fmt)
        on_emulated_gpu(gpu, cuda_lib)
        keys = np.arange(n, dtype=np.int64)
        gpu.insert(keys, stored)
        out = np.empty((n + 1, dim), np.float32)
        miss, hits = gpu.query_into(np.append(keys[::-1], 10**9), out)
        assert miss.tolist() == [n] and hits == n
        want = fmt.decode(stored[::-1], dim)
        np.testing.assert_array_equal(out[:n].view(np.uint32), want.view(np.uint32))
        assert not out[n].any()


def test_staging_buffers_are_reused_and_grown(cuda_lib: ctypes.CDLL) -> None:
    """The host path allocates its pinned and device buffers once, grows them for a larger
    batch (to a power of two) and allocates nothing for batches that fit."""
    gpu = EmbeddingCache(8, 64)
    device = on_emulated_gpu(gpu, cuda_lib)
    gpu.insert(np.arange(64, dtype=np.int64), np.ones((64, 8), np.float32))
    for n in (10, 5, 10):
        gpu.query_into(np.arange(n, dtype=np.int64), np.empty((n, 8), np.float32))
    first = device.allocations
    assert first == 4  # keys: pinned, device; rows back: device, pinned
    gpu.query_into(np.arange(300, dtype=np.int64), np.empty((300, 8), np.float32))
    grown = device.allocations
    assert grown > first
    for n in (1, 299, 300):
        gpu.query_into(np.arange(n, dtype=np.int64), np.empty((n, 8), np.float32))
    assert device.allocations == grown


def test_the_emulated_stream_runs_when_the_host_waits(cuda_lib: ctypes.CDLL) -> None:
    """What makes a missing wait fail these tests: copies and launches queue until
    ``synchronize``; a pinned destination holds 0xA5 until then; a copy reads its pinned
    source when it runs (a buffer refilled meanwhile is what arrives); a copy into pageable
    memory waits for what is queued before it, as the driver's does."""
    device = EmulatedDevice(cuda_lib)
    staged = device.pinned("in", 64)
    staged[:] = 1
    buf = device.buffer("in", 64)
    device.to_device(buf, staged)
    staged[:] = 2  # refilled while its copy is queued
    back = device.pinned("out", 64)
    device.to_host(back, buf)
    assert (back == GARBAGE).all()
    device.synchronize()
    assert (back == 2).all()
    pageable = np.full(64, 7, np.uint8)
    device.zero(buf)
    device.to_host(pageable, buf)
    assert not pageable.any()
