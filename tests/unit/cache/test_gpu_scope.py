"""The CuPy path on the GPU it was given, and on the stream its ordering needs, without a GPU.

CuPy allocates and launches on the current GPU. A cache of GPU 1 used from a thread whose
current GPU is 0 (a ``KIND_CPU`` instance or a CLI session with ``deployed_device_list[0]``
!= 0, a calibration) must still put every array, copy and launch on GPU 1, and the device's
stream ordering holds only on CUDA's legacy default stream (:mod:`hps.cache.device`). A
stand-in for CuPy (tests/unit/cache/fake_cupy.py: NumPy arrays that remember their GPU, the
kernels' CUDA source built for the CPU) records the GPU and stream of each; answers must equal
NumPy's all the same.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from hps.cache.device import gpu_device
from hps.cache.embedding_cache import EmbeddingCache
from hps.cache.gpu_request import Fill, pool_rows
from hps.cache.many import answer_buffer, fill_on_gpu, one_gpu, query_tables_into
from hps.ctr.network import pool_embeddings
from hps.errors import ConfigError
from hps.rowformat import FORMATS
from tests.unit.cache import fake_cupy
from tests.unit.cache.test_fused_property import _same_state

TABLES = ((4, "float32", "lru"), (40, "float16", "lfu"), (130, "int8", "frequency"))
PROBES = ("launch:probe_gather", "launch:probe_gather_tables", "launch:scatter_rows")
WRITES = ("launch:place_rows", "launch:write_rows")


def _pairs(cp: fake_cupy.FakeCupy, gpu: int) -> list[tuple[EmbeddingCache, EmbeddingCache]]:
    """Per table a cache on ``cp``'s GPU ``gpu`` and its twin on NumPy (reference path)."""
    pairs = []
    for dim, row_dtype, policy in TABLES:
        on_gpu, ref = (
            EmbeddingCache(
                dim, 64, xp=xp, device_id=gpu, policy=policy, fmt=FORMATS[row_dtype],
                frequency_window=50,
            )
            for xp in (cp, np)
        )  # fmt: skip
        ref._kernel = None
        pairs.append((on_gpu, ref))
    return pairs


def test_a_cache_of_another_gpu_runs_everything_there(
    monkeypatch: pytest.MonkeyPatch, cuda_lib: ctypes.CDLL
) -> None:
    """Built, written, probed one table at a time and all at once (rows into host memory
    or GPU memory, rows found below L1 filled in) from a thread on GPU 0: every array, copy
    and launch on GPU 1; the probes and copies on the device's stream, the write kernels on
    the default stream; the answers and the caches' states as on NumPy."""
    cp = fake_cupy.install(monkeypatch, cuda_lib)
    pairs = _pairs(cp, 1)
    assert cp.gpus_of("array:") == {1}  # rows, index, policy, write log: all on GPU 1
    rng = np.random.default_rng(0)
    keys = np.arange(60, dtype=np.int64)
    for gpu, ref in pairs:
        stored = gpu.fmt.encode(rng.standard_normal((60, gpu.dim)).astype(np.float32))
        newer = gpu.fmt.encode(rng.standard_normal((20, gpu.dim)).astype(np.float32))
        for cache in (gpu, ref):
            since = cache.version
            cache.insert(keys, stored)
            cache.update(keys[:20], newer)
            cache.insert(keys[10:30], stored[10:30], since=since)  # a stale fill: skipped
            cache.evict(keys[50:55])
            cache.release(cache.hold(keys[:3]))
        request = rng.integers(-2, 80, 100).astype(np.int64)
        got, want = (np.empty((100, gpu.dim), np.float32) for _ in "ab")
        (miss, hits), (want_miss, want_hits) = (
            gpu.query_into(request, got),
            ref.query_into(request, want),
        )
        assert (miss.tolist(), hits) == (want_miss.tolist(), want_hits)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(
            gpu.query(np.unique(request))[0], ref.query(np.unique(request))[0]
        )
    caches, refs = [p[0] for p in pairs], [p[1] for p in pairs]
    segs = [rng.integers(-2, 80, n).astype(np.int64) for n in (7, 30, 11)]
    ends = np.cumsum([s.size for s in segs])
    bounds = np.stack([ends - [s.size for s in segs], ends], axis=1)
    sizes = np.array([s.size * c.dim for s, c in zip(segs, caches, strict=True)])
    offsets = np.cumsum(sizes) - sizes
    lead = one_gpu(caches)
    assert lead is not None
    for on_device in (False, True):
        out = answer_buffer(lead, int(sizes.sum()), on_device=on_device)
        answers = query_tables_into(caches, np.concatenate(segs), bounds, out, offsets,
                                    out_on_device=on_device)  # fmt: skip
        assert answers is not None
        if on_device:  # the misses filled in on the device, as the pipeline does
            assert isinstance(out, fake_cupy.DeviceArray) and out.gpu == 1
            fills = [
                Fill(int(o), s.size, c.dim, a[0], np.ones((a[0].size, c.dim), np.float32))
                for o, s, c, a in zip(offsets, segs, caches, answers, strict=True)
            ]
            fill_on_gpu(lead, out, fills)
        for t, (seg, ref) in enumerate(zip(segs, refs, strict=True)):
            want = np.empty((seg.size, ref.dim), np.float32)
            miss, hits = ref.query_into(seg, want)
            if on_device:
                want[miss] = 1.0
            assert answers[t][0].tolist() == miss.tolist() and answers[t][1] == hits
            np.testing.assert_array_equal(out[offsets[t] : offsets[t] + want.size], want.ravel())
    for gpu, ref in pairs:
        _same_state(gpu, ref)
    assert {e.gpu for e in cp.events} == {1} and cp.current == 0
    stream = gpu_device(1).stream.ptr
    assert {e.stream for e in cp.events if e.what in ("copy", "fill", *PROBES)} == {stream}
    assert {e.stream for e in cp.events if e.what in WRITES} == {0}
    assert {e.what for e in cp.events} >= {*PROBES, *WRITES}


def test_rows_are_pooled_on_their_gpu(
    monkeypatch: pytest.MonkeyPatch, cuda_lib: ctypes.CDLL
) -> None:
    """The CTR model's pooling of rows on GPU 1, called from a thread on GPU 0: the pooled
    rows, the staging and the launch on GPU 1 (``pool_rows`` enters the device's scope)."""
    cp = fake_cupy.install(monkeypatch, cuda_lib)
    dims = [3, 70]
    offsets = np.array([[0, 2, 2, 5], [0, 1, 4, 4]])
    flat = np.random.default_rng(1).standard_normal(5 * 3 + 4 * 70).astype(np.float32)
    with cp.cuda.Device(1):
        rows = cp.asarray(flat)
    cp.events.clear()
    got = pool_rows(gpu_device(1), rows, offsets[:, -1], offsets, dims)
    assert isinstance(got, fake_cupy.DeviceArray) and got.gpu == 1
    assert {e.gpu for e in cp.events} == {1} and cp.current == 0
    assert "launch:pool_rows" in {e.what for e in cp.events}
    want = pool_embeddings(flat, offsets[:, -1], offsets, dims)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_per_thread_default_stream_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1`` nothing orders the cache's writes
    with the device's stream: the first cache on a GPU refuses to start."""
    cp = fake_cupy.install(monkeypatch)
    cp.per_thread = True
    with pytest.raises(ConfigError, match="CUPY_CUDA_PER_THREAD_DEFAULT_STREAM"):
        EmbeddingCache(4, 16, xp=cp, device_id=1)
    with pytest.raises(ConfigError, match="current CUDA stream is 0x2, not the legacy"):
        gpu_device(0)


def test_a_launch_under_another_stream_is_refused(
    monkeypatch: pytest.MonkeyPatch, cuda_lib: ctypes.CDLL
) -> None:
    """A stream of the caller's made current around a cache operation: refused before
    anything is launched, the probe and the writes alike."""
    cp = fake_cupy.install(monkeypatch, cuda_lib)
    cache = EmbeddingCache(4, 16, xp=cp, device_id=1)
    keys = np.arange(4, dtype=np.int64)
    with cp.cuda.Device(1), cp.cuda.Stream():
        with pytest.raises(ConfigError, match="not the legacy default stream"):
            cache.query_into(keys, np.empty((4, 4), np.float32))
        with pytest.raises(ConfigError, match="not the legacy default stream"):
            cache.insert(keys, np.ones((4, 4), np.float32))
    assert not [e for e in cp.events if e.what.startswith("launch:")]
