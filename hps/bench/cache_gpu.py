"""``hps bench cache --mode throughput --device cupy``: the GPU L1 against its floors.

On top of the rows every device prints (``query``, ``query_numpy``, ``query_then_expand``,
``insert``: :mod:`hps.bench.cache`), a cache on a GPU prints, timed in turn in the same loop
on the same batch:

- ``query_device``: the probe+gather kernel alone (keys already on the device, rows left
  there: :meth:`hps.cache.kernels_cupy.GpuProbe.on_device`) against a raw ``take`` of the
  same rows at precomputed indices into a device buffer;
- ``query_host_floor``: ``query_into`` as serving calls it (host keys in, rows into the
  device's pinned response buffer, where the pipeline's host answers go) against its floor:
  the keys copied into pinned memory and to the device, the raw take, the rows back into
  pinned memory;
- ``query_host_pinned``: the same call against one into an ordinary (pageable) buffer of
  the same shape, which the driver stages: what the response buffer gains;
- ``query_vs_cpu``: ``query_into`` on the GPU against the compiled CPU kernel on a NumPy
  cache of the same rows (``ratio`` > 1: the GPU is faster);
- ``query_tables`` (``--tables`` > 1): the many-table call (one launch for all tables:
  :func:`hps.cache.many.query_tables_into`) against one ``query_into`` per table;
- ``query_tables_on_gpu`` (``--tables`` > 1): the same call with the rows left in a device
  buffer (what the CTR model asks for) against the call that brings them to the host.

Every row names the device it ran on (``device_name``).
"""

from __future__ import annotations

import argparse
import functools
import platform
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from hps.cache.embedding_cache import EmbeddingCache
from hps.cache.kernels_cupy import GpuProbe
from hps.cache.many import query_tables_into
from hps.types import JSON, ArrayModule

if TYPE_CHECKING:
    import cupy


@functools.lru_cache(maxsize=4)
def device_name(xp: ArrayModule) -> str:
    """The GPU's name for CuPy, the CPU's for NumPy."""
    if xp is np:
        return platform.processor() or platform.machine()
    props = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


Timer = Callable[[list[Callable[[], object]]], list[float]]
Row = Callable[[str, float, float], JSON]


def gpu_rows(
    args: argparse.Namespace,
    xp: ArrayModule,
    time_them: Timer,
    row: Row,
    cache: EmbeddingCache,
    cpu_cache: EmbeddingCache,
    batch: np.ndarray,
) -> Iterator[JSON]:
    """The GPU rows for ``cache`` (on ``xp``) and ``batch``; ``cpu_cache`` holds the same
    rows on NumPy. ``time_them`` gives the median seconds of each function, ``row`` one
    output row from (op, our seconds, baseline seconds)."""
    probe = cache._kernel
    assert isinstance(probe, GpuProbe), "the GPU rows need the compiled GPU kernel"
    n, dim = batch.size, cache.dim
    rows = cache._rows
    keys_d = xp.asarray(batch)
    idx_d = rows.lookup(keys_d)
    out_d = xp.empty(n * dim, dtype=xp.float32)
    miss_d = xp.empty(n, dtype=xp.int64)
    tallies_d = xp.zeros(2, dtype=xp.uint64)
    taken = xp.empty((n, rows.width), dtype=rows.values.dtype)
    access = cache.policy.access_counts()
    counts, cap = access if access is not None else (None, 0)

    def device_only() -> None:
        with cache._lock:
            cache._tick += 1
            probe.on_device(rows, keys_d, out_d, cache._tick, counts, cap, miss_d, tallies_d)
        probe.device.synchronize()

    def raw_take() -> None:
        xp.take(rows.values, idx_d, axis=0, out=taken)

    t_dev, t_take = time_them([device_only, raw_take])
    yield row("query_device", t_dev, t_take)
    yield from _host(xp, time_them, row, cache, cpu_cache, batch, keys_d, idx_d, taken)
    if args.tables > 1:  # after _host: its answer no longer holds the response buffer
        yield from _tables(args, xp, time_them, row, cache, batch)


def _host(
    xp: ArrayModule,
    time_them: Timer,
    row: Row,
    cache: EmbeddingCache,
    cpu_cache: EmbeddingCache,
    batch: np.ndarray,
    keys_d: cupy.ndarray,
    idx_d: cupy.ndarray,
    taken: cupy.ndarray,
) -> Iterator[JSON]:
    """The host path's rows: ``query_into`` into the response buffer against its floor
    (``keys_d``, ``idx_d``, ``taken``: the batch's keys, row indices and a buffer of its
    stored rows on the device), against an ordinary buffer and against the CPU kernel."""
    import cupyx

    probe = cache._kernel
    assert isinstance(probe, GpuProbe)
    n, dim, rows = batch.size, cache.dim, cache._rows
    keys_pinned = cupyx.empty_pinned(n, dtype=np.int64)
    rows_pinned = cupyx.empty_pinned((n, rows.width), dtype=rows.values.dtype)
    out = probe.device.response(n * dim).reshape(n, dim)
    pageable = np.empty((n, dim), dtype=np.float32)

    def host_path() -> None:
        cache.query_into(batch, out)

    def floor() -> None:
        keys_pinned[:] = batch
        keys_d.set(keys_pinned)
        xp.take(rows.values, idx_d, axis=0, out=taken)
        taken.get(out=rows_pinned)

    t_host, t_floor = time_them([host_path, floor])
    yield row("query_host_floor", t_host, t_floor)

    def host_pageable() -> None:
        cache.query_into(batch, pageable)

    t_host, t_pageable = time_them([host_path, host_pageable])
    yield row("query_host_pinned", t_host, t_pageable)

    def cpu_kernel() -> None:
        cpu_cache.query_into(batch, pageable)

    t_host, t_cpu = time_them([host_path, cpu_kernel])
    yield row("query_vs_cpu", t_host, t_cpu) | {"cpu": device_name(np)}


def _tables(
    args: argparse.Namespace,
    xp: ArrayModule,
    time_them: Timer,
    row: Row,
    cache: EmbeddingCache,
    batch: np.ndarray,
) -> Iterator[JSON]:
    """``--tables`` caches of ``--rows`` / ``--tables`` rows: the many-table call against
    one ``query_into`` per table, on the same keys."""
    n_tables, per, dim = args.tables, args.batch_per_table, cache.dim
    keys, stored = cache.dump()
    size = max(1, keys.size // n_tables)
    tables = []
    for t in range(n_tables):
        part = slice(t * size, (t + 1) * size)
        table = EmbeddingCache(dim, size, xp=xp, policy=cache.policy.name, fmt=cache.fmt)
        table.insert(keys[part], stored[part])
        tables.append(table)
    pick = np.random.default_rng(args.seed).integers(0, size, (n_tables, per))
    request = keys[: n_tables * size].reshape(n_tables, size)[np.arange(n_tables)[:, None], pick]
    flat = request.reshape(-1)
    bounds = np.stack([np.arange(n_tables) * per, np.arange(1, n_tables + 1) * per], axis=1)
    offsets = np.arange(n_tables, dtype=np.int64) * per * dim
    probe = cache._kernel
    assert isinstance(probe, GpuProbe)
    out = probe.device.response(flat.size * dim)  # as the pipeline answers
    views = [out[o : o + per * dim].reshape(per, dim) for o in offsets.tolist()]

    def many() -> None:
        query_tables_into(tables, flat, bounds, out, offsets)

    def one_by_one() -> None:
        for table, segment, view in zip(tables, request, views, strict=True):
            table.query_into(segment, view)

    t_many, t_each = time_them([many, one_by_one])
    yield row("query_tables", t_many, t_each) | {"tables": n_tables}

    out_d = xp.empty(flat.size * dim, dtype=xp.float32)

    def on_gpu() -> None:
        query_tables_into(tables, flat, bounds, out_d, offsets, out_on_device=True)

    t_gpu, t_many = time_them([on_gpu, many])
    yield row("query_tables_on_gpu", t_gpu, t_many) | {"tables": n_tables}
