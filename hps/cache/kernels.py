"""Compiled L1 kernels: the hash probe fused with the gather and the L1 bookkeeping.

One call reads one table's slice of a request (duplicates included, no de-duplication):
for each key it walks the :class:`hps.index.KeyIndex` probe sequence, copies the row into
the output (request order), stamps the row's last-access tick and bumps its access count,
and notes the position of each miss. In NumPy this is a dedup, a few probe rounds, a tick
scatter, a count scatter, a gather and an expansion: several passes over memory. Compiled,
it is one loop.

Back-ends, picked once per process (:func:`cpu_kernel`):

- numba (``numba.njit(cache=True, nogil=True)``): the CPU path, compiled on first use and
  cached on disk (``__pycache__`` next to this module, or ``NUMBA_CACHE_DIR``), so a Triton
  instance pays the compilation once per installation, not per start. ``nogil`` lets the
  instances' request threads and the background L1 work run side by side.
- a CuPy raw kernel (:mod:`hps.cache.kernels_cupy`) for caches on a GPU.
- none: :meth:`hps.cache.EmbeddingCache.query_into` falls back to the NumPy reference path
  (dedup + :meth:`~hps.cache.EmbeddingCache.query`), which the tests compare both against.

``HPS_KERNELS=numpy`` turns the compiled CPU path off (measurements, debugging).

Unique hits are counted without a dedup: a row whose tick already equals this query's tick
was hit earlier in the same call. Reserved keys (``EMPTY``, ``TOMBSTONE``) never hit.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from hps.index import EMPTY, GROUP, TOMBSTONE

log = logging.getLogger(__name__)

# Signature of the compiled CPU kernel:
# (slot_keys, slot_rows, gmask, values, keys, out, ticks, tick, counts, cap, miss_pos)
#   -> (number of misses, number of distinct rows hit)
ProbeGather = Callable[..., tuple[int, int]]
NO_COUNTS = np.zeros(0, dtype=np.int32)
COUNT_CAP_NONE = np.iinfo(np.int32).max


def _probe_gather_py(
    slot_keys: np.ndarray,
    slot_rows: np.ndarray,
    gmask: int,
    values: np.ndarray,
    keys: np.ndarray,
    out: np.ndarray,
    ticks: np.ndarray,
    tick: int,
    counts: np.ndarray,
    cap: int,
    miss_pos: np.ndarray,
) -> tuple[int, int]:
    """The kernel's body; compiled by numba. Run as Python only by a test, on a few keys."""
    m1 = np.uint64(0xBF58476D1CE4E5B9)
    m2 = np.uint64(0x94D049BB133111EB)
    s30, s27, s31 = np.uint64(30), np.uint64(27), np.uint64(31)
    umask = np.uint64(gmask)
    empty, tomb = np.int64(EMPTY), np.int64(TOMBSTONE)
    dim = values.shape[1]
    udim = np.uint64(dim)
    flat_values = values.reshape(-1)  # flat arrays and unsigned offsets: a plain copy loop
    flat_out = out.reshape(-1)
    n = keys.shape[0]
    found = np.empty(n, dtype=np.int64)
    # Two loops in one call: the probes alone keep many cache misses in flight (the copies
    # in between would stall them), then one copy pass writes the rows in request order.
    for i in range(n):
        k = keys[i]
        row = -1
        if k > tomb:
            x = np.uint64(k)
            x = x ^ (x >> s30)
            x = x * m1
            x = x ^ (x >> s27)
            x = x * m2
            x = x ^ (x >> s31)
            g = np.int64(x & umask)
            r = 1
            while True:
                base = g * GROUP
                ended = False
                for j in range(GROUP):
                    sk = slot_keys[base + j]
                    if sk == k:
                        row = int(slot_rows[base + j])
                        break
                    if sk == empty:
                        ended = True
                if row >= 0 or ended or r > gmask + 1:
                    break
                g = (g + r) & gmask
                r += 1
        found[i] = row
    n_miss = 0
    n_hit = 0
    for i in range(n):
        row = found[i]
        dst = np.uint64(i) * udim
        if row < 0:
            miss_pos[n_miss] = i
            n_miss += 1
            for d in range(dim):
                flat_out[dst + np.uint64(d)] = 0.0
        else:
            src = np.uint64(row) * udim
            for d in range(dim):
                flat_out[dst + np.uint64(d)] = flat_values[src + np.uint64(d)]
            if ticks[row] != tick:
                ticks[row] = tick
                n_hit += 1
            if counts.shape[0]:
                c = counts[row] + 1
                counts[row] = c if c < cap else cap
    return n_miss, n_hit


@functools.lru_cache(maxsize=1)
def cpu_kernel() -> ProbeGather | None:
    """The compiled CPU kernel, or ``None`` (no numba, or ``HPS_KERNELS=numpy``)."""
    if os.environ.get("HPS_KERNELS", "").lower() == "numpy":
        return None
    try:
        import numba
    except ImportError:
        log.info("numba not installed: the L1 cache uses its NumPy path")
        return None
    kernel: ProbeGather = numba.njit(cache=True, nogil=True, error_model="numpy")(
        _probe_gather_py
    )
    return kernel


def warm_up() -> float:
    """Compile (or load from the disk cache) the CPU kernel now; returns the seconds it took."""
    import time

    start = time.perf_counter()
    kernel = cpu_kernel()
    if kernel is not None:
        slots = np.full(16, EMPTY, dtype=np.int64)
        rows = np.full(16, -1, dtype=np.int32)
        vals = np.zeros((1, 1), dtype=np.float32)
        keys = np.ones(1, dtype=np.int64)
        ticks = np.zeros(1, dtype=np.int64)
        kernel(slots, rows, 1, vals, keys, np.empty((1, 1), np.float32), ticks, 1,
               NO_COUNTS, COUNT_CAP_NONE, np.empty(1, np.int64))  # fmt: skip
    return time.perf_counter() - start


# What EmbeddingCache calls: (row store, host keys, host out, tick, counts or None, cap)
#   -> (host miss positions, distinct rows hit)
CacheKernel = Callable[[Any, np.ndarray, np.ndarray, int, Any, int], tuple[np.ndarray, int]]


def kernel_for(xp: Any) -> CacheKernel | None:
    """The compiled probe+gather for caches on ``xp``, or ``None`` (use the NumPy path)."""
    if xp is np:
        kernel = cpu_kernel()
        return None if kernel is None else functools.partial(_run_cpu, kernel)
    if os.environ.get("HPS_KERNELS", "").lower() == "numpy":
        return None
    from hps.cache.kernels_cupy import run_cupy

    return run_cupy


def _run_cpu(kernel: ProbeGather, rows: Any, keys: np.ndarray, out: np.ndarray, tick: int,
             counts: Any, cap: int) -> tuple[np.ndarray, int]:  # fmt: skip
    index = rows.index
    miss_pos = np.empty(keys.shape[0], dtype=np.int64)
    n_miss, n_hit = kernel(
        index.slot_keys, index.slot_rows, index.gmask, rows.values, keys, out, rows.ticks,
        tick, NO_COUNTS if counts is None else counts, cap or COUNT_CAP_NONE, miss_pos,
    )  # fmt: skip
    return miss_pos[:n_miss], int(n_hit)
