"""The GPU host path's staging buffers, as ``hps plan`` sizes them and as a device holds them.

One sizing rule (:func:`hps.cache.gpu_request.request_staging` over
:func:`hps.cache.device.staging_nbytes`) serves the plan; here a request of a model's
configured size runs through the pipeline's L1 probe on caches whose kernels run on an
emulated device (tests/unit/cache/cuda_emulation.py: the host path as on a GPU), and the
buffers that device then holds must be exactly what the plan prints.
"""

from __future__ import annotations

import ctypes
from dataclasses import astuple
from pathlib import Path

import numpy as np

from hps.cache import EmbeddingCache, cache_capacity
from hps.cache.calibrate import request_keys
from hps.cache.device import MIN_BUFFER, Staging, grown, staging_nbytes
from hps.cache.gpu_request import Fill, fill_rows, pool_rows, request_staging
from hps.cache.kernels_cupy import tables_layout
from hps.cache.many import answer_buffer, one_gpu
from hps.pipeline import Probed, probe_l1
from hps.plan import gpu_lines, l1_gpu, plan, to_json
from hps.topology import topology
from hps.types import TableSpec
from tests.helpers import make_config
from tests.unit.cache.cuda_emulation import EmulatedDevice, on_emulated_gpu


def _model(tmp_path: Path, device: str = "auto", **extra: object) -> dict[str, object]:
    return {
        "model": "m",
        "embedding_table_names": ["a", "b", "c"],
        "embedding_vecsize_per_table": [16, 5, 64],
        "maxnum_catfeature_query_per_table_per_sample": [3, 1, 2],
        "max_batch_size": 8,
        "gpucacheper": 1.0,
        "hps_instances": 3,
        "deployed_device_list": [0, 1],
        "hps_cache": {"device": device},
        **extra,
    }


def _request(specs: list[TableSpec], caches: list[EmbeddingCache], keys: list[int]) -> None:
    """One request through the pipeline's L1 probe (every table with keys in one call)."""
    probed: list[Probed] = []
    k = v = 0
    for spec, cache, n in zip(specs, caches, keys, strict=True):
        if n:
            probed.append((spec, cache, k, n, v))
        k, v = k + n, v + n * spec.dim
    flat = np.random.default_rng(k).integers(0, 100, k, dtype=np.int64)
    out = answer_buffer(one_gpu(caches), v)  # the pipeline's host answer
    assert len(probe_l1(probed, flat, out)) == len(probed)


def test_the_plan_counts_what_the_device_holds(cuda_lib: ctypes.CDLL, tmp_path: Path) -> None:
    """The caches of a process share its GPU's device (``hps.cache.device.gpu_device``): one
    set of buffers, whichever tables a request asks for."""
    cfg = make_config(tmp_path, models=[_model(tmp_path)])
    model = cfg.models[0]
    keys, dims = request_keys(model), [t.dim for t in model.tables]
    assert keys == [24, 8, 16]  # max_batch_size x keys per sample
    caches = [EmbeddingCache(d, 128) for d in dims]
    device = EmulatedDevice(cuda_lib)
    for cache, dim in zip(caches, dims, strict=True):
        on_emulated_gpu(cache, cuda_lib, device=device)
        cache.insert(np.arange(100, dtype=np.int64), np.ones((100, dim), np.float32))
    specs = model.tables
    _request(specs, caches, [2, 1, 1])  # a small request first: the buffers grow later
    _request(specs, caches, keys)
    _request(specs, caches, [5, 3, 7])  # smaller again: nothing grows
    _request(specs, caches, [0, 8, 16])  # the first table left out: still the one set
    _request(specs, caches, [0, 0, 16])
    held = device.held()
    assert held == request_staging(keys, dims)

    (gpu,) = l1_gpu(cfg, plan(cfg, {"m.a": 200, "m.b": 300, "m.c": 400}))
    assert (gpu.staging_pinned_bytes, gpu.staging_device_bytes) == (held.pinned, held.device)
    assert gpu.request_keys == 48 and gpu.device == "auto"
    assert gpu.cache_bytes == sum(
        EmbeddingCache(d, cache_capacity(model, n)).nbytes
        for d, n in zip(dims, (200, 300, 400), strict=True)
    )
    # auto: every instance's L1 on the first listed GPU (cupy spreads them, below)
    assert (gpu.instances, gpu.devices, gpu.instances_per_device) == (3, 1, 3)
    assert gpu.device_bytes_per_device == 3 * (gpu.cache_bytes + held.device)
    assert gpu.pinned_bytes == 3 * held.pinned
    (line,) = gpu_lines([gpu])
    assert "if start-up picks cupy" in line and "pinned host memory" in line
    assert '"staging_pinned_bytes"' in to_json([], topology(cfg), gpus=[gpu])


def test_the_staging_layout_grows_to_powers_of_two() -> None:
    layout = tables_layout(n_keys=1000, n_tables=2, row_bytes=1000 * 16 * 4)
    assert layout.desc_at == 8000 and layout.plan_at == 8000 + 2 * 13 * 8
    assert layout.in_bytes == layout.plan_at + 2 * 6 * 8
    assert layout.miss_at == 64000 and layout.tally_at == 72000
    assert layout.out_bytes == 72000 + 32
    device = {"keys": layout.in_bytes, "out": layout.out_bytes}
    # pinned: the misses and tallies apart, the rows in the response buffer
    pinned = {"keys": layout.in_bytes, "out": 8000 + 32, "response": 64000}
    assert request_staging([600, 400], [16, 16]) == staging_nbytes(pinned, device)
    assert staging_nbytes(pinned, device) == Staging(16384 + 8192 + 65536, 16384 + 131072)
    assert grown(1) == MIN_BUFFER and grown(MIN_BUFFER + 1) == 2 * MIN_BUFFER
    assert request_staging([], []) == Staging(0, 0)


def test_the_device_counts_its_buffers(cuda_lib: ctypes.CDLL) -> None:
    device = EmulatedDevice(cuda_lib)
    device.pinned("keys", 5000)
    device.buffer("keys", 5000)
    device.buffer("out", 10)
    assert device.held() == staging_nbytes({"keys": 5000}, {"keys": 5000, "out": 10})


def test_no_gpu_lines_for_a_numpy_l1_or_none(tmp_path: Path) -> None:
    cfg = make_config(
        tmp_path,
        models=[
            {**_model(tmp_path, "numpy"), "model": "n"},
            {**_model(tmp_path, "cupy"), "model": "g"},
            {**_model(tmp_path), "model": "off", "gpucache": False},
        ],
    )
    plans = plan(cfg, {f"{m}.{t}": 100 for m in ("n", "g", "off") for t in "abc"})
    gpus = l1_gpu(cfg, plans)
    assert [(g.model, g.device) for g in gpus] == [("g", "cupy")]
    assert "if start-up" not in gpu_lines(gpus)[0]
    memory = {p.table.split(".")[0]: p.cache_memory for p in plans}
    assert memory == {"n": "host", "g": "gpu", "off": "host"}


def test_the_plan_counts_what_a_ctr_instance_holds(cuda_lib: ctypes.CDLL, tmp_path: Path) -> None:
    """A CTR instance keeps the rows on the GPU: a cold request (every key missed, so every
    row goes in through the fill buffers), pooled there, grows its buffers to what the plan
    prints; with ``cupy`` an embedding instance answers on the GPU the same way, unpooled."""
    doc = _model(tmp_path, "cupy", dense_file=str(tmp_path / "d.npz"))
    cfg = make_config(tmp_path, models=[doc])
    model = cfg.models[0]
    assert model.serves_ctr and model.processes == 6
    keys, dims = request_keys(model), [t.dim for t in model.tables]
    caches = [EmbeddingCache(d, 128) for d in dims]
    device = on_emulated_gpu(caches[0], cuda_lib)
    for cache in caches[1:]:
        on_emulated_gpu(cache, cuda_lib, device=device)
    probed: list[Probed] = []
    k = v = 0
    for spec, cache, n in zip(model.tables, caches, keys, strict=True):
        probed.append((spec, cache, k, n, v))
        k, v = k + n, v + n * spec.dim
    flat = np.arange(k, dtype=np.int64)
    out = np.zeros(v, np.float32)  # the request's rows on the (emulated) device
    answers = probe_l1(probed, flat, out, out_on_device=True)
    fills = [
        Fill(v, n, spec.dim, miss, np.ones((miss.size, spec.dim), np.float32))
        for (spec, _, _, n, v), (miss, _) in zip(probed, answers, strict=True)
    ]
    assert all(f.positions.size == f.n for f in fills)  # cold: all missed
    fill_rows(device, out, fills)
    assert (out == 1).all()
    embedding = request_staging(keys, dims, rows_on_device=True)
    held = device.held()
    assert (held.pinned, held.device + 4 * v) == (embedding.pinned, embedding.device)

    per_sample = [3, 1, 2]  # maxnum_catfeature_query_per_table_per_sample
    batch = model.max_batch_size
    offsets = np.array([np.arange(batch + 1) * c for c in per_sample])
    pooled = pool_rows(device, out, np.array(keys), offsets, dims)
    want_pooled = np.repeat(np.array(per_sample, np.float32), dims)  # sums of ones
    np.testing.assert_array_equal(pooled, np.broadcast_to(want_pooled, (batch, sum(dims))))
    ctr = request_staging(keys, dims, rows_on_device=True, pooled_samples=batch)
    held = device.held()
    assert (held.pinned, held.device + 4 * v + pooled.nbytes) == (ctr.pinned, ctr.device)

    (gpu,) = l1_gpu(cfg, plan(cfg, {"m.a": 200, "m.b": 300, "m.c": 400}))
    assert (gpu.staging_pinned_bytes, gpu.staging_device_bytes) == astuple(embedding)
    assert (gpu.ctr_staging_pinned_bytes, gpu.ctr_staging_device_bytes) == astuple(ctr)
    per_model = 2  # instances of each Triton model on GPU 0 (round robin): ceil(3 / 2)
    assert (gpu.instances, gpu.devices, gpu.instances_per_device) == (6, 2, 2 * per_model)
    assert gpu.device_bytes_per_device == per_model * (
        2 * gpu.cache_bytes + embedding.device + ctr.device
    )
    assert gpu.pinned_bytes == 3 * (embedding.pinned + ctr.pinned)
    assert "a CTR instance (rows kept on the GPU)" in gpu_lines([gpu])[0]
