"""Time one request's L1 probe on an array module: what ``hps_cache.device: auto`` compares.

Per table of the model, a synthetic cache of the table's dim, row format and policy, full of
keys ``0 .. rows - 1``; a request of the model's configured size (:func:`request_keys`) of
uniform keys over them (all hits); probed as serving probes it
(:func:`hps.cache.many.probe_tables`, what ``hps.pipeline.probe_l1`` runs: every table in
one call; on CuPy host keys in and rows into the device's pinned response buffer, the host
path of :mod:`hps.cache.kernels_cupy` as the pipeline answers). One untimed call first (it
compiles or loads the kernels), then ``repeats`` timed ones: the median. With
``rows_on_device`` (a CTR instance, which keeps a request's rows on the GPU and runs its
network there) the GPU path writes the rows into a buffer on the GPU, as that instance
serves; so the staging buffers a calibration grows are those its serving grows.

The synthetic caches hold at most :data:`CALIBRATION_BYTES` of rows per model (at most
:data:`MAX_ROWS` and at most the real capacity per table), so the rows do not fit in the
CPU's caches unless the real ones do, and the calibration stays short: a few hundred
milliseconds plus the first compile.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np

from hps.cache.embedding_cache import EmbeddingCache
from hps.cache.many import answer_buffer, one_gpu, probe_tables
from hps.config import ModelConfig
from hps.types import ArrayModule

CALIBRATION_BYTES = 64 << 20  # stored rows of one model's synthetic caches, per module
MAX_ROWS = 1 << 18  # rows of one synthetic cache at most
REPEATS = 5  # timed requests per module

Timer = Callable[[], float]


def request_keys(model: ModelConfig) -> list[int]:
    """Keys per table of one request of the configured size: ``max_batch_size`` x
    ``maxnum_catfeature_query_per_table_per_sample`` (``TableSpec.max_keys_per_request``),
    or ``max_batch_size`` (one key per sample) where the model gives no per-table count."""
    return [t.max_keys_per_request or model.max_batch_size for t in model.tables]


def synthetic_rows(model: ModelConfig, capacities: Sequence[int] | None = None) -> list[int]:
    """Rows of each table's synthetic cache (see the module docstring)."""
    stored = sum(t.fmt.row_bytes(t.dim) for t in model.tables)
    budget = max(1, CALIBRATION_BYTES // max(1, stored))
    caps = list(capacities) if capacities is not None else [MAX_ROWS] * len(model.tables)
    return [max(1, min(cap, budget, MAX_ROWS)) for cap in caps]


def calibrate(
    model: ModelConfig,
    xp: ArrayModule,
    *,
    capacities: Sequence[int] | None = None,
    device_id: int | None = None,
    rows_on_device: bool = False,
    repeats: int = REPEATS,
    timer: Timer = time.perf_counter,
    seed: int = 0,
) -> float:
    """Median seconds of one request's L1 probe on ``xp`` (see the module docstring).

    ``capacities``: the real caches' rows per table (bounds the synthetic ones);
    ``device_id``: the GPU (CuPy); ``rows_on_device``: the rows stay on the GPU (a CTR
    instance; NumPy ignores it); ``timer``: a clock in seconds (tests pass a fake one).
    """
    if repeats < 1:
        raise ValueError(f"calibration needs at least one repetition, got {repeats}")
    rng = np.random.default_rng(seed)
    caches: list[EmbeddingCache] = []
    keys: list[np.ndarray] = []
    for spec, n, rows in zip(
        model.tables, request_keys(model), synthetic_rows(model, capacities), strict=True
    ):
        cache = EmbeddingCache(
            spec.dim, rows, xp=xp, policy=model.hps_cache.policy, name=f"calibration:{spec.name}",
            device_id=device_id, fmt=spec.fmt,
        )  # fmt: skip
        cache.insert(
            np.arange(rows, dtype=np.int64),
            np.zeros((rows, spec.fmt.width(spec.dim)), dtype=spec.fmt.dtype),
            force=True,
        )
        keys.append(rng.integers(0, rows, size=n, dtype=np.int64))
        caches.append(cache)
    dims = [t.dim for t in model.tables]
    counts = np.array([k.size for k in keys], dtype=np.int64)
    ends = np.cumsum(counts)
    bounds = np.stack([ends - counts, ends], axis=1)
    sizes = counts * np.array(dims, dtype=np.int64)
    offsets = np.cumsum(sizes) - sizes
    request = np.concatenate(keys)
    lead = one_gpu(caches)
    on_device = rows_on_device and lead is not None
    out = answer_buffer(lead, int(sizes.sum()), on_device=on_device)

    def probe() -> None:
        probe_tables(caches, dims, request, bounds, out, offsets, out_on_device=on_device)

    probe()  # compiles or loads the kernels: not timed
    times = []
    for _ in range(repeats):
        start = timer()
        probe()
        times.append(timer() - start)
    return float(statistics.median(times))
