"""A request answered on the GPU that holds L1 (``lookup_request(..., on_gpu=True)``).

The CTR model pools and runs its dense network where L1 is, so its rows never cross to the
host: L1's kernel writes them into a buffer on the GPU, and the rows found below L1 go in
with one copy for the whole request. Here the caches run the GPU kernels on an emulated
device (tests/unit/cache/cuda_emulation.py: host memory, the host path as on a GPU) and,
where a GPU is lent (``make gpu-check``), on the GPU itself (conftest's ``gpu``); the answer
must equal the host path's, value for value and counter for counter, while the only copy
back is the miss list and the tallies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hps.cache.device import Device
from hps.cache.embedding_cache import EmbeddingCache
from hps.cache.gpu_request import fill_nbytes, pool_rows
from hps.cache.kernels_cupy import tables_layout
from hps.cache.xp import to_host
from hps.ctr.network import pool_embeddings
from hps.lookup import LookupSession
from hps.storage.hash_map import HashMapStore
from hps.tiers import Tiers
from tests.helpers import make_config
from tests.unit.cache.cuda_emulation import EmulatedDevice, GpuCaches
from tests.unit.cache.test_fused_property import SETTINGS

DIMS = (4, 40, 70)  # probes of 8 and 16 lanes; rows wider than a warp filled in
CACHED = ("demo.t0", "demo.t1")  # demo.t2 has no L1: all its rows come from below


class CopyCounter:
    """Records the bytes of every copy a device makes, each way, until :meth:`close`."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.to_device: list[int] = []
        self.to_host: list[int] = []
        for way, log in (("to_device", self.to_device), ("to_host", self.to_host)):
            copy = getattr(device, way)

            def counted(dst: Any, src: Any, copy: Any = copy, log: list[int] = log) -> None:
                log.append(int(src.nbytes))
                copy(dst, src)

            setattr(device, way, counted)

    def clear(self) -> None:
        self.to_device.clear()
        self.to_host.clear()

    def close(self) -> None:
        """The device's own copies again (a GPU's device outlives the test)."""
        del self.device.to_device, self.device.to_host


def _session(tmp_path: Path, gpu: GpuCaches | None, stored: int) -> LookupSession:
    """Three tables over an in-memory L2 holding the even keys below ``2 * stored``; L1 on
    the first two, on one device of ``gpu`` or on NumPy (``None``)."""
    cfg = make_config(
        tmp_path,
        models=[
            {
                "model": "demo",
                "embedding_table_names": ["t0", "t1", "t2"],
                "embedding_vecsize_per_table": list(DIMS),
                "default_value_for_each_table": [0.5, -1.0, 2.0],
                "max_batch_size": 1024,
                "gpucache": True,
                "hit_rate_threshold": 1.0,  # misses go into L1 before the request returns
            }
        ],
        persistent_db={"type": "disabled"},
    )
    l2 = HashMapStore()
    rng = np.random.default_rng(stored)
    for spec in cfg.models[0].tables:
        keys = np.arange(stored, dtype=np.int64) * 2
        l2.open_table(spec)
        l2.insert(spec.name, keys, rng.standard_normal((stored, spec.dim)).astype(np.float32))
    pairs = zip(CACHED, DIMS[:2], strict=True)
    if gpu is None:
        caches = {name: EmbeddingCache(dim, 48, name=name) for name, dim in pairs}
    else:
        device = gpu.device()
        caches = {name: gpu.cache(dim, 48, device, name=name) for name, dim in pairs}
    return LookupSession(cfg.models, Tiers(l2, None), caches=caches)


def _device(session: LookupSession) -> Device:
    cache = session.caches[CACHED[0]]
    assert isinstance(cache, EmbeddingCache)
    device = cache._kernel.device  # type: ignore[union-attr]
    assert isinstance(device, Device)
    return device


table_keys = st.lists(st.integers(0, 200), max_size=60)


@SETTINGS
@given(
    stored=st.integers(10, 80),
    requests=st.lists(st.tuples(table_keys, table_keys, table_keys), min_size=1, max_size=4),
)
def test_rows_answered_on_the_gpu_match_the_host_path(
    gpu: GpuCaches,
    tmp_path_factory: pytest.TempPathFactory,
    stored: int,
    requests: list[tuple[list[int], list[int], list[int]]],
) -> None:
    tmp = tmp_path_factory.mktemp("on-gpu")
    on_gpu, host = _session(tmp, gpu, stored), _session(tmp, None, stored)
    copies = CopyCounter(_device(on_gpu))
    try:
        for request in requests:
            keys = np.concatenate([np.array(t, dtype=np.int64) for t in request])
            counts = np.array([len(t) for t in request], dtype=np.int32)
            copies.clear()
            got = on_gpu.lookup_request("demo", keys, counts, on_gpu=True)
            assert isinstance(got, gpu.xp.ndarray)  # on the device (the emulated one: host)
            want = host.lookup_request("demo", keys, counts)
            np.testing.assert_array_equal(to_host(got), want)
            n_cached = counts[0] + counts[1]
            if n_cached:
                # back: the miss list and the tallies, never the rows
                tables = int(counts[0] > 0) + int(counts[1] > 0)
                layout = tables_layout(keys.size, tables, 0)  # miss list sized for all keys
                assert copies.to_host == [layout.out_bytes]
            # in: the keys (if any table has L1 keys), then at most one copy of rows
            assert len(copies.to_device) <= int(n_cached > 0) + 1
            if counts[2]:
                assert len(copies.to_device) == int(n_cached > 0) + 1
        assert on_gpu.stats()["tables"] == host.stats()["tables"]
        for name in CACHED:
            assert np.array_equal(
                np.sort(on_gpu.caches[name].resident_keys()),
                np.sort(host.caches[name].resident_keys()),
            )
    finally:
        copies.close()
        on_gpu.close()
        host.close()


def test_one_copy_carries_every_row_found_below_l1(gpu: GpuCaches, tmp_path: Path) -> None:
    """A cold request (every key misses L1) brings its rows to the device in one copy."""
    session = _session(tmp_path, gpu, 50)
    copies = CopyCounter(_device(session))
    keys = np.array([0, 2, 4, 2, 1, 6, 8, 10, 12, 3], dtype=np.int64)  # 1, 3: found nowhere
    counts = np.array([4, 3, 3], dtype=np.int32)
    want = np.concatenate(
        [
            session.lookup(f"demo.t{t}", part).ravel()
            for t, part in enumerate(np.split(keys, [4, 7]))
        ]
    )
    for cache in session.caches.values():
        cache.clear()  # type: ignore[attr-defined]
    copies.clear()
    try:
        got = session.lookup_request("demo", keys, counts, on_gpu=True)
        np.testing.assert_array_equal(to_host(got), want)
        rows = 4 * (4 * DIMS[0] + 3 * DIMS[1] + 3 * DIMS[2])
        assert copies.to_device == [tables_layout(10, 2, 0).in_bytes, fill_nbytes(10, rows // 4)]
    finally:
        copies.close()
        session.close()


def test_without_one_gpu_the_rows_are_answered_on_the_host(tmp_path: Path) -> None:
    session = _session(tmp_path, None, 20)
    keys = np.array([0, 2, 4, 5], dtype=np.int64)
    got = session.lookup_request("demo", keys, np.array([2, 1, 1], np.int32), on_gpu=True)
    assert isinstance(got, np.ndarray) and got.shape == (2 * DIMS[0] + DIMS[1] + DIMS[2],)
    default = np.full(DIMS[2], 2.0, np.float32)
    np.testing.assert_array_equal(got[-DIMS[2] :], default)  # key 5: the default
    session.close()


@SETTINGS
@given(
    counts=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=7), min_size=1, max_size=4),
    dims=st.lists(st.integers(1, 40), min_size=4, max_size=4),
    seed=st.integers(0, 1000),
)
def test_rows_pooled_on_the_gpu_match_the_host_pooling(
    gpu: GpuCaches, counts: list[list[int]], dims: list[int], seed: int
) -> None:
    """The CTR model's pooling in one launch (``pool_rows``): NumPy's sums up to float32
    rounding (NumPy adds a contiguous run pairwise), empty segments zero, rows wider than a
    warp included."""
    batch = len(counts[0])
    counts = [(c * batch)[:batch] for c in counts]  # as many samples in every table
    dims = dims[: len(counts)]
    rng = np.random.default_rng(seed)
    tables = zip(counts, dims, strict=True)
    flat = np.concatenate([rng.standard_normal(sum(c) * d).astype(np.float32) for c, d in tables])
    offsets = np.array([[0, *np.cumsum(c)] for c in counts])
    device = gpu.device()
    with device.scope():
        rows = gpu.xp.asarray(flat)
    got = to_host(pool_rows(device, rows, offsets[:, -1], offsets, dims))
    want = pool_embeddings(flat, offsets[:, -1], offsets, dims)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert ((got == 0) == (want == 0)).all()  # empty segments: exactly zero
    if isinstance(device, EmulatedDevice):
        assert device.launches == ["pool_rows"]
