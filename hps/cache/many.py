"""The L1 probe of every table of a request in one compiled call.

:meth:`hps.cache.EmbeddingCache.query_into` crosses from Python into the compiled kernel
once per table; for a 26-table request the crossings (locks, argument checks, dispatch,
result objects) cost about a third as much as the probes themselves. Here the caches' locks
are taken together, each cache contributes one row of addresses
(:data:`hps.cache.kernels.DESCRIPTOR`), and one call of the many-table kernel probes,
gathers and stamps all tables. Afterwards each cache runs its own policy and counters, as
after ``query_into``: the end state is the same as a ``query_into`` per table. Caches on
NumPy go through the numba kernel, caches on one GPU through one CUDA launch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from hps.cache import kernels
from hps.cache.embedding_cache import EmbeddingCache
from hps.cache.gpu_request import Fill, fill_rows
from hps.cache.kernels_cupy import GpuProbe, run_tables
from hps.types import Array, Keys, Vectors


class QueryInto(Protocol):
    """An L1 cache as :func:`probe_tables` needs it (``EmbeddingCache`` is one)."""

    def query_into(self, keys: Keys, out: Vectors) -> tuple[npt.NDArray[np.int64], int]: ...


def probe_tables(
    caches: Sequence[QueryInto],
    dims: Sequence[int],
    keys: np.ndarray,
    bounds: np.ndarray,
    out: Array,
    out_offsets: np.ndarray,
    *,
    out_on_device: bool = False,
) -> list[tuple[np.ndarray, int]]:
    """Every table's L1 probe of a request, as a lookup runs it: :func:`query_tables_into`
    (one compiled call) where the caches allow, else one ``query_into`` per cache (rows of
    ``dims[t]`` elements). Arguments and answers as :func:`query_tables_into`'s; with
    ``out_on_device`` the caches must share one GPU (:func:`one_gpu`)."""
    answers = query_tables_into(caches, keys, bounds, out, out_offsets, out_on_device=out_on_device)
    if answers is not None:
        return answers
    if out_on_device:
        raise ValueError("rows on the device need every cache on that one GPU")
    return [
        cache.query_into(keys[lo:hi], out[v : v + (hi - lo) * dim].reshape(hi - lo, dim))
        for cache, dim, (lo, hi), v in zip(
            caches, dims, bounds.tolist(), out_offsets.tolist(), strict=True
        )
    ]


def one_gpu(caches: Sequence[object]) -> EmbeddingCache | None:
    """The first of ``caches`` when they are all :class:`EmbeddingCache` on one GPU, that is
    on its one shared device (:func:`hps.cache.device.gpu_device`; one launch probes them
    all, into a buffer of that GPU: :func:`query_tables_into`), else ``None``."""
    devices = set()
    for cache in caches:  # every request asks: NumPy caches answer at the first
        kernel = cache._kernel if isinstance(cache, EmbeddingCache) else None
        if not isinstance(kernel, GpuProbe):
            return None
        devices.add(id(kernel.device))
    first = caches[0] if len(devices) == 1 else None
    return first if isinstance(first, EmbeddingCache) else None


def answer_buffer(lead: EmbeddingCache | None, n: int, *, on_device: bool = False) -> Array:
    """An uninitialised flat float32 buffer for a request's ``n`` answered elements. With
    ``lead`` (:func:`one_gpu` of the request's caches): on its GPU (``on_device``, a CuPy
    array), else its device's pinned response buffer, which the rows reach in one copy
    (:meth:`hps.cache.device.Device.response`). Without: ordinary host memory."""
    if lead is None:
        return np.empty(n, dtype=np.float32)
    assert isinstance(lead._kernel, GpuProbe)
    if not on_device:
        return lead._kernel.device.response(n)
    with lead._scope:
        rows: Array = lead.xp.empty(n, dtype=np.float32)
    return rows


def fill_on_gpu(lead: EmbeddingCache, out: Array, fills: Sequence[Fill]) -> None:
    """Rows found below L1 into ``out``, a buffer on ``lead``'s GPU (:func:`one_gpu`): one
    copy for every table (:func:`hps.cache.gpu_request.fill_rows`, on the GPU's shared
    device)."""
    assert isinstance(lead._kernel, GpuProbe)
    with lead._scope:
        fill_rows(lead._kernel.device, out, fills)


def query_tables_into(
    caches: Sequence[object],
    keys: np.ndarray,
    bounds: np.ndarray,
    out: Array,
    out_offsets: np.ndarray,
    *,
    out_on_device: bool = False,
) -> list[tuple[np.ndarray, int]] | None:
    """Probe ``caches[t]`` with ``keys[bounds[t, 0]:bounds[t, 1]]`` (int64 ``[T, 2]``,
    non-empty, non-overlapping), writing its rows into the flat float32 ``out`` from
    ``out_offsets[t]`` in request order (misses as zeros). ``out`` is a host buffer, or with
    ``out_on_device`` a buffer on the caches' GPU, which the rows never leave.

    Returns per table the miss positions (within its keys) and the distinct keys hit, as
    ``query_into`` does; ``None`` when some cache is not an :class:`EmbeddingCache` on a
    compiled path, or the caches are on different devices (the caller then queries table by
    table). The caches must be distinct. On a GPU all tables go in one launch
    (:func:`hps.cache.kernels_cupy.run_tables`): keys in and rows out in one copy each.
    """
    ours = [c for c in caches if isinstance(c, EmbeddingCache) and c.takes_descriptor]
    if len(ours) != len(caches):
        return None
    lead = one_gpu(ours)
    kernel = kernels.cpu_tables_kernel()
    if lead is None and any(isinstance(c._kernel, GpuProbe) for c in ours):
        return None  # mixed devices: table by table
    if lead is None and (kernel is None or out_on_device):
        return None
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    n_tables = len(caches)
    result = np.zeros((n_tables, 2), dtype=np.int64)
    miss_pos = np.empty(keys.size, dtype=np.int64)
    locks = [cache._lock for cache in ours]
    for lock in locks:
        lock.acquire()
    try:
        desc = np.empty((n_tables, len(kernels.DESCRIPTOR)), dtype=np.int64)
        for t, cache in enumerate(ours):
            desc[t] = cache._descriptor()
        if lead is not None:  # one launch on the caches' GPU
            assert isinstance(lead._kernel, GpuProbe)
            with lead._scope:
                result, miss_pos = run_tables(
                    lead._kernel.device, desc, keys, bounds, out, out_offsets,
                    out_on_device=out_on_device,
                )  # fmt: skip
        else:
            assert kernel is not None
            kernel(desc, bounds, keys, out, out_offsets, miss_pos, result)
        answers = []
        for cache, (lo, hi), (n_miss, n_hit) in zip(
            ours, bounds.tolist(), result.tolist(), strict=True
        ):
            misses = miss_pos[lo : lo + n_miss]
            with cache._scope:  # its policy's arrays on its GPU, whichever one is current
                cache._after_probe(keys[lo:hi], misses, n_hit)
            answers.append((misses, n_hit))
    finally:
        for lock in reversed(locks):
            lock.release()
    return answers
