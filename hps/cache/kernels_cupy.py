"""The GPU probe+gather: a CuPy raw kernel with the contract of :mod:`hps.cache.kernels`.

One thread per requested key walks the :class:`hps.index.KeyIndex` probe sequence in device
memory, copies the row into the device output, stamps the row's tick (an atomic exchange,
which also tells whether the row was already hit in this call: the distinct-hit count) and
bumps its access count (atomic add, then clamped to the cap). Misses claim a slot of the
miss list with an atomic add; the list is sorted afterwards, so positions come back in
request order as on the CPU. Keys go to the device once and vectors come back once.

Compiled by NVRTC on first use; CuPy keeps the binary in its on-disk kernel cache
(``~/.cupy/kernel_cache``), so later processes load it. Runs only where CuPy and a GPU
exist; the NumPy reference path is what tests compare it with on a GPU machine.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from hps.index import EMPTY, GROUP, TOMBSTONE

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
    if (use_counts) {
        const int c = atomicAdd(counts + row, 1);
        if (c + 1 > cap) atomicMin(counts + row, cap);
    }
}
"""

_THREADS = 256


@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    import cupy

    defines = (
        f"#define GROUP {GROUP}\n#define EMPTY_KEY ({int(EMPTY) + 1}LL - 1LL)\n"
        f"#define TOMB ({int(TOMBSTONE)}LL)\n"
    )
    return cupy.RawKernel(defines + _SOURCE, "probe_gather")


def run_cupy(rows: Any, keys: np.ndarray, out: np.ndarray, tick: int, counts: Any,
             cap: int) -> tuple[np.ndarray, int]:  # fmt: skip
    """Probe and gather on the GPU; ``out`` (host) receives the rows, as the CPU kernel."""
    import cupy

    index = rows.index
    n = int(keys.shape[0])
    kd = cupy.asarray(keys)
    od = cupy.empty((n, rows.dim), dtype=cupy.float32)
    miss = cupy.empty(max(n, 1), dtype=cupy.int64)
    tallies = cupy.zeros(2, dtype=cupy.uint64)
    use_counts = counts is not None
    cd = counts if use_counts else cupy.zeros(1, dtype=cupy.int32)
    if n:
        blocks = (n + _THREADS - 1) // _THREADS
        _kernel()(
            (blocks,), (_THREADS,),
            (index.slot_keys, index.slot_rows, np.int64(index.gmask), rows.values,
             np.int32(rows.dim), kd, np.int64(n), od, rows.ticks.view(cupy.uint64),
             np.uint64(tick), cd, np.int32(use_counts), np.int32(cap), miss,
             tallies[0:1], tallies[1:2]),
        )  # fmt: skip
    n_miss, n_hit = (int(t) for t in tallies.get())
    out[...] = od.get()
    return np.sort(miss[:n_miss].get()), n_hit
