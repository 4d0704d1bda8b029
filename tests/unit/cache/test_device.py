"""One staging device per GPU and process, shared by its caches (hps.cache.device)."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np
import pytest

from hps.cache import EmbeddingCache, device, kernels
from hps.cache.calibrate import calibrate, request_keys
from hps.cache.device import gpu_device, staging_nbytes
from hps.cache.gpu_request import request_staging
from hps.cache.kernels_cupy import THREADS, GpuProbe, blocks_for, tables_layout
from hps.cache.many import one_gpu
from tests.helpers import make_config
from tests.unit.cache.cuda_emulation import EmulatedDevice, on_emulated_gpu


class _Recorded:
    """Stands in for CupyDevice (no CuPy here): remembers its GPU."""

    def __init__(self, gpu: int) -> None:
        self.gpu = gpu


def test_a_process_has_one_device_per_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device, "CupyDevice", _Recorded)
    monkeypatch.setattr(device, "_gpu_devices", {})
    first, again, other = gpu_device(0), gpu_device(0), gpu_device(1)
    assert first is again and first is not other
    assert (first.gpu, other.gpu) == (0, 1)


def test_caches_sharing_a_device_answer_right_from_two_threads(cuda_lib: ctypes.CDLL) -> None:
    """The device's lock keeps one call's staging buffers from another's: two threads query
    two caches on one device, each must read its own rows."""
    shared = EmulatedDevice(cuda_lib)
    caches = [EmbeddingCache(4, 256) for _ in range(2)]
    for n, cache in enumerate(caches):
        on_emulated_gpu(cache, cuda_lib, device=shared)
        keys = np.arange(200, dtype=np.int64)
        cache.insert(keys, (np.full((200, 4), n + 1) + keys[:, None]).astype(np.float32))
    wrong: list[str] = []

    def reader(n: int) -> None:
        rng = np.random.default_rng(n)
        for _ in range(30):
            keys = rng.integers(0, 220, 1 + n * 50, dtype=np.int64)
            out = np.empty((keys.size, 4), np.float32)
            misses, _ = caches[n].query_into(keys, out)
            want = np.where(keys < 200, keys + n + 1, 0).astype(np.float32)
            missed = np.flatnonzero(keys >= 200).tolist()
            if misses.tolist() != missed or (out != want[:, None]).any():
                wrong.append(f"cache {n}: rows of another call")

    threads = [threading.Thread(target=reader, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


@pytest.mark.parametrize("rows_on_device", [False, True])
def test_a_calibration_grows_what_serving_grows(
    cuda_lib: ctypes.CDLL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows_on_device: bool
) -> None:
    """The GPU path is timed as the instance serves: rows back to the host (the embedding
    model), or left on the GPU (a CTR instance); the staging it leaves is serving's."""
    shared = EmulatedDevice(cuda_lib)
    monkeypatch.setattr(kernels, "kernel_for", lambda xp, device_id=None: GpuProbe(shared))
    cfg = make_config(
        tmp_path,
        models=[
            {
                "model": "m",
                "embedding_table_names": ["a", "b"],
                "embedding_vecsize_per_table": [8, 4],
                "max_batch_size": 16,
            }
        ],
    )
    model = cfg.models[0]
    seconds = calibrate(model, np, capacities=[64, 64], rows_on_device=rows_on_device, repeats=2)
    assert seconds > 0
    probes = [name for name in shared.launches if name.startswith("probe")]
    assert probes == ["probe_gather_tables"] * 3  # one launch per request, on the GPU
    keys, dims = request_keys(model), [t.dim for t in model.tables]
    if not rows_on_device:
        assert shared.held() == request_staging(keys, dims)
        return
    layout = tables_layout(sum(keys), len(keys), 0)  # no rows in the staging: misses, tallies
    need = {"keys": layout.in_bytes, "out": layout.out_bytes}
    assert shared.held() == staging_nbytes(need, need)


def test_one_launch_needs_one_shared_device(cuda_lib: ctypes.CDLL) -> None:
    caches = [EmbeddingCache(4, 16) for _ in range(3)]
    shared = on_emulated_gpu(caches[0], cuda_lib)
    on_emulated_gpu(caches[1], cuda_lib, device=shared)
    assert one_gpu(caches[:2]) is caches[0]
    on_emulated_gpu(caches[2], cuda_lib)  # another GPU's device
    assert one_gpu(caches) is None
    assert one_gpu([caches[0], EmbeddingCache(4, 16)]) is None  # one on the host


def test_a_launch_has_at_most_the_blocks_the_device_runs_at_once(cuda_lib: ctypes.CDLL) -> None:
    gpu = EmulatedDevice(cuda_lib)
    gpu.resident_threads = 132 * 2048  # an H100: 132 multiprocessors of 2,048 threads
    assert [blocks_for(w, gpu) for w in (0, 1, 8, 9)] == [1, 1, 1, 2]
    assert blocks_for(10**6, gpu) == 132 * 2048 // THREADS
