"""Compiled L1 kernels: the hash probe fused with the gather and the L1 bookkeeping.

One call reads one table's slice of a request (duplicates included, no de-duplication):
for each key it walks the :class:`hps.index.KeyIndex` probe sequence, copies the row into
the output (request order), stamps the row's last-access tick and bumps its access count,
and notes the position of each miss. In NumPy this is a dedup, a few probe rounds, a tick
scatter, a count scatter, a gather and an expansion: several passes over memory. Compiled,
it is one call of three straight passes with prefetching (:mod:`hps.cache._numba_kernel`).

Back-ends, picked once per process (:func:`cpu_kernel`):

- numba (``numba.njit(cache=True, nogil=True)``): the CPU path, compiled on first use and
  cached on disk (``__pycache__`` next to this module when writable, else numba's user cache
  folder or ``NUMBA_CACHE_DIR``), so a Triton instance pays the compilation (about 6-7 s
  here for the three row formats' versions, :func:`warm_up`) once per installation, not
  per start; loading the cached kernel and numba takes
  about 1-1.5 s. An image can compile it at build time with
  ``python -c "from hps.cache.kernels import warm_up; warm_up()"``. ``nogil`` lets the
  instances' request threads and the background L1 work run side by side. Where numba
  cannot load or compile it (no folder this user may cache it in, say), the NumPy path
  runs, after one warning (:func:`hps.jit.not_compiled`).
- warp-cooperative CUDA kernels (:mod:`hps.cache.kernels_cupy`) for caches on a GPU: the
  probe+gather of one table or of every table of a request in one launch, and the index
  lookups and row writes of inserts and updates (:mod:`hps.cache.gpu_rows`).
- none: :meth:`hps.cache.EmbeddingCache.query_into` falls back to the NumPy reference path
  (dedup + :meth:`~hps.cache.EmbeddingCache.query`), which the tests compare both against.

``HPS_KERNELS=numpy`` (:mod:`hps.jit`) turns the compiled paths off (measurements, debugging).

Rows are stored in the table's :class:`hps.rowformat.RowFormat`; every back-end
dequantizes float16 and int8 rows into the float32 output as it copies them (one pass, no
second pass over the output), and float32 rows are copied as before. The compiled kernels
read a float16 arena as its bits (``RowStore.kernel_values``, ``uint16``).

Unique hits are counted without a dedup: a row whose tick already equals this query's tick
was hit earlier in the same call. Reserved keys (``EMPTY``, ``TOMBSTONE``) never hit.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from hps.cache.device import address
from hps.index import EMPTY
from hps.jit import compiled_allowed, not_compiled
from hps.rowformat import FORMATS
from hps.types import Array, ArrayModule

if TYPE_CHECKING:
    from hps.cache.rows import RowStore

log = logging.getLogger(__name__)

# Signature of the compiled CPU kernel:
# (slot_keys, slot_rows, gmask, values, keys, out, ticks, tick, counts, cap, miss_pos)
#   -> (number of misses, number of distinct rows hit)
ProbeGather = Callable[..., tuple[int, int]]
# Signature of the compiled many-table CPU kernel (writes result[t] = misses, distinct hits):
# (descriptors int64[T, 13], bounds int64[T, 2] (first, end key), keys, out float32[total],
#  out_offsets int64[T], miss_pos int64[n], result int64[T, 2]) -> None
ProbeGatherTables = Callable[..., None]
# Columns of a cache's row in the descriptors: addresses and sizes of its arrays (the cache's
# lock held while they are used), the query's tick, the count cap, the stored elements per row
# and the row format (FORMAT_CODES).
DESCRIPTOR = (
    "slot_keys", "slot_rows", "slots", "gmask", "values", "dim", "capacity",
    "ticks", "tick", "counts", "cap", "width", "format",
)  # fmt: skip
# A row format's code in the kernels (the descriptors' column, the CUDA kernel's argument).
FORMAT_CODES = {"float32": 0, "float16": 1, "int8": 2}
NO_COUNTS = np.zeros(0, dtype=np.int32)
COUNT_CAP_NONE = np.iinfo(np.int32).max


@functools.lru_cache(maxsize=1)
def cpu_kernel() -> ProbeGather | None:
    """The compiled CPU kernel, or ``None`` (no numba, or ``HPS_KERNELS=numpy``)."""
    if not compiled_allowed():
        return None
    try:  # any failure (no numba; no folder to cache the kernel in): the NumPy path
        from hps.cache._numba_kernel import probe_gather
    except Exception as exc:
        not_compiled("the L1 cache", exc)
        return None
    kernel: ProbeGather = probe_gather
    return kernel


@functools.lru_cache(maxsize=1)
def cpu_tables_kernel() -> ProbeGatherTables | None:
    """The compiled many-table CPU kernel, or ``None`` where :func:`cpu_kernel` is."""
    if cpu_kernel() is None:
        return None
    from hps.cache._numba_kernel import probe_gather_tables

    kernel: ProbeGatherTables = probe_gather_tables
    return kernel


def warm_up() -> float:
    """Compile (or load from the disk cache) the CPU kernel now; returns the seconds it took."""
    import time

    start = time.perf_counter()
    kernel = cpu_kernel()
    if kernel is not None:
        slots = np.full(16, EMPTY, dtype=np.int64)
        rows = np.full(16, -1, dtype=np.int32)
        keys = np.ones(1, dtype=np.int64)
        ticks = np.zeros(1, dtype=np.int64)
        for fmt in FORMATS.values():  # one compiled version per arena dtype
            vals = kernel_view(fmt.empty(1, 1))
            kernel(slots, rows, 1, vals, keys, np.empty((1, 1), np.float32), ticks, 1,
                   NO_COUNTS, COUNT_CAP_NONE, np.empty(1, np.int64))  # fmt: skip
        vals = np.zeros((1, 1), dtype=np.float32)
        desc = np.array([[slots.ctypes.data, rows.ctypes.data, 16, 1, vals.ctypes.data, 1, 1,
                          ticks.ctypes.data, 2, 0, COUNT_CAP_NONE, 1, FORMAT_CODES["float32"]]],
                        dtype=np.int64)  # fmt: skip
        tables = cpu_tables_kernel()
        assert tables is not None
        bounds, out = np.array([[0, 1]], np.int64), np.empty(1, np.float32)
        tables(desc, bounds, keys, out, np.zeros(1, np.int64), np.empty(1, np.int64),
               np.zeros((1, 2), np.int64))  # fmt: skip
    return time.perf_counter() - start


def kernel_view(values: np.ndarray) -> np.ndarray:
    """An arena as the compiled CPU kernel reads it: float16 as its bits (``uint16``)."""
    return values.view(np.uint16) if values.dtype == np.float16 else values


# What EmbeddingCache calls: (row store, host keys, host out, tick, counts or None, cap)
#   -> (host miss positions, distinct rows hit)
CacheKernel = Callable[
    ["RowStore", np.ndarray, np.ndarray, int, Array | None, int], tuple[np.ndarray, int]
]


def kernel_for(xp: ArrayModule, device_id: int | None = None) -> CacheKernel | None:
    """The compiled probe+gather for a new cache on ``xp``, or ``None`` (use the NumPy path);
    on CuPy a :class:`hps.cache.kernels_cupy.GpuProbe` on GPU ``device_id``'s shared
    :class:`hps.cache.device.Device` (``None``: the current GPU)."""
    if xp is np:
        kernel = cpu_kernel()
        return None if kernel is None else functools.partial(_run_cpu, kernel)
    if not compiled_allowed():
        return None
    from hps.cache.device import gpu_device
    from hps.cache.kernels_cupy import GpuProbe

    return GpuProbe(gpu_device(device_id))


class CacheDescriptor:
    """One cache's row of the many-table kernels' descriptors (:data:`DESCRIPTOR`): the
    addresses of its arrays (host or device), rebuilt only when one of them was replaced
    (the arrays are kept referenced, so an address is never reused while the row names it)."""

    def __init__(self) -> None:
        self._row = np.zeros(len(DESCRIPTOR), dtype=np.int64)
        self._arrays: tuple[Array | None, ...] = ()
        self._ids: tuple[int, ...] = ()

    def row(self, rows: RowStore, counts: Array | None, cap: int, tick: int) -> np.ndarray:
        """The row for a query at ``tick`` (the cache's lock held until the kernel ran)."""
        arrays = (rows.index.slot_keys, rows.index.slot_rows, rows.values, rows.ticks, counts)
        if tuple(map(id, arrays)) != self._ids:
            slot_keys, slot_rows, values, ticks, _ = arrays
            self._row = np.array(
                [address(slot_keys), address(slot_rows), slot_keys.size, 0,
                 address(values), rows.dim, values.shape[0], address(ticks), 0,
                 0 if counts is None else address(counts), cap, rows.width,
                 FORMAT_CODES[rows.fmt.name]],
                dtype=np.int64,
            )  # fmt: skip
            self._arrays = arrays  # referenced: their ids and addresses stay theirs
            self._ids = tuple(map(id, arrays))
        desc = self._row
        desc[3] = rows.index.gmask
        desc[8] = tick
        desc[10] = cap
        return desc


def _run_cpu(kernel: ProbeGather, rows: RowStore, keys: np.ndarray, out: np.ndarray, tick: int,
             counts: Array | None, cap: int) -> tuple[np.ndarray, int]:  # fmt: skip
    index = rows.index
    miss_pos = np.empty(keys.shape[0], dtype=np.int64)
    n_miss, n_hit = kernel(
        index.slot_keys, index.slot_rows, index.gmask, rows.kernel_values, keys, out, rows.ticks,
        tick, NO_COUNTS if counts is None else counts, cap or COUNT_CAP_NONE, miss_pos,
    )  # fmt: skip
    return miss_pos[:n_miss], int(n_hit)
