"""The GPU probe+gather: a CuPy raw kernel with the contract of :mod:`hps.cache.kernels`.

One thread per requested key walks the :class:`hps.index.KeyIndex` probe sequence in device
memory, copies the row into the device output, stamps the row's tick (an atomic exchange,
which also tells whether the row was already hit in this call: the distinct-hit count) and
bumps its access count (a compare-and-swap loop that stops at the cap). Misses claim a slot
of the miss list with an atomic add; the list is sorted afterwards, so positions come back
in request order as on the CPU. Keys go to the device once and vectors come back once.

Compiled by NVRTC on first use; CuPy keeps the binary in its on-disk kernel cache
(``~/.cupy/kernel_cache``), so later processes load it. Runs only where CuPy and a GPU
exist; tests compare it with the NumPy reference path there, and everywhere else compile
the same source as C++ and run it thread by thread on the CPU
(tests/unit/cache/test_kernel_cuda_source.py).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from hps.index import EMPTY, GROUP, TOMBSTONE
from hps.types import Array

if TYPE_CHECKING:
    import cupy

    from hps.cache.rows import RowStore

_SOURCE = r"""
extern "C" __global__ void probe_gather(
    const long long* slot_keys, const int* slot_rows, const long long gmask,
    const float* values, const int dim, const long long* keys, const long long n,
    float* out, unsigned long long* ticks, const unsigned long long tick,
    int* counts, const int use_counts, const int cap,
    long long* miss_pos, unsigned long long* n_miss, unsigned long long* n_hit)
{
    long long i = (long long)blockDim.x * blockIdx.x + threadIdx.x;
    if (i >= n) return;
    const long long k = keys[i];
    long long row = -1;
    if (k > TOMB) {
        unsigned long long x = (unsigned long long)k;
        x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ULL;
        x ^= x >> 27; x *= 0x94D049BB133111EBULL;
        x ^= x >> 31;
        long long g = (long long)(x & (unsigned long long)gmask);
        for (long long r = 1; ; ++r) {
            bool ended = false;
            const long long base = g * GROUP;
            for (int j = 0; j < GROUP; ++j) {
                const long long sk = slot_keys[base + j];
                if (sk == k) { row = slot_rows[base + j]; break; }
                if (sk == EMPTY_KEY) ended = true;
            }
            if (row >= 0 || ended || r > gmask + 1) break;
            g = (g + r) & gmask;
        }
    }
    float* dst = out + i * dim;
    if (row < 0) {
        miss_pos[atomicAdd(n_miss, 1ULL)] = i;
        for (int d = 0; d < dim; ++d) dst[d] = 0.0f;
        return;
    }
    const float* src = values + row * dim;
    for (int d = 0; d < dim; ++d) dst[d] = src[d];
    if (atomicExch(ticks + row, tick) != tick) atomicAdd(n_hit, 1ULL);
    if (use_counts) {  // a saturating add: an add then a clamp would wrap at INT_MAX
        int c = counts[row];
        while (c < cap) {
            const int seen = atomicCAS(counts + row, c, c + 1);
            if (seen == c) break;
            c = seen;
        }
    }
}
"""

THREADS = 256  # per block


def kernel_source() -> str:
    """The kernel's CUDA source with the index's constants defined."""
    defines = (
        f"#define GROUP {GROUP}\n#define EMPTY_KEY ({int(EMPTY) + 1}LL - 1LL)\n"
        f"#define TOMB ({int(TOMBSTONE)}LL)\n"
    )
    return defines + _SOURCE


@functools.lru_cache(maxsize=1)
def _kernel() -> cupy.RawKernel:
    import cupy

    return cupy.RawKernel(kernel_source(), "probe_gather")


def kernel_arguments(rows: RowStore, keys: Array, out: Array, tick: int, counts: Array | None,
                     cap: int, miss: Array, tallies: Array) -> tuple[object, ...]:  # fmt: skip
    """The kernel's arguments in its order, for arrays of ``rows.xp`` (device arrays here;
    host arrays where tests run the source compiled for the CPU): ``keys`` int64 ``[n]``,
    ``out`` float32 ``[n, dim]``, ``miss`` int64 ``[>= n]``, ``tallies`` uint64 ``[2]``
    (zeros; the kernel adds the misses and the distinct hits)."""
    index = rows.index
    use_counts = counts is not None
    cd = counts if use_counts else rows.xp.zeros(1, dtype=np.int32)
    return (
        index.slot_keys, index.slot_rows, np.int64(index.gmask), rows.values,
        np.int32(rows.dim), keys, np.int64(keys.shape[0]), out, rows.ticks.view(np.uint64),
        np.uint64(tick), cd, np.int32(use_counts), np.int32(cap), miss,
        tallies[0:1], tallies[1:2],
    )  # fmt: skip


def run_cupy(rows: RowStore, keys: np.ndarray, out: np.ndarray, tick: int, counts: Array | None,
             cap: int) -> tuple[np.ndarray, int]:  # fmt: skip
    """Probe and gather on the GPU; ``out`` (host) receives the rows, as the CPU kernel."""
    import cupy

    n = int(keys.shape[0])
    kd = cupy.asarray(keys)
    od = cupy.empty((n, rows.dim), dtype=cupy.float32)
    miss = cupy.empty(max(n, 1), dtype=cupy.int64)
    tallies = cupy.zeros(2, dtype=cupy.uint64)
    if n:
        blocks = (n + THREADS - 1) // THREADS
        args = kernel_arguments(rows, kd, od, tick, counts, cap, miss, tallies)
        _kernel()((blocks,), (THREADS,), args)
    n_miss, n_hit = (int(t) for t in tallies.get())
    out[...] = od.get()
    return np.sort(miss[:n_miss].get()), n_hit
