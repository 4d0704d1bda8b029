"""The GPU probe+gather: a CuPy raw kernel with the contract of :mod:`hps.cache.kernels`.

One thread per requested key walks the :class:`hps.index.KeyIndex` probe sequence in device
memory, copies the row into the device output (dequantizing float16 and int8 rows as it
copies, as the CPU kernel: :mod:`hps.cache.kernels`), stamps the row's tick (an atomic exchange,
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

from hps.cache.kernels import FORMAT_CODES
from hps.index import EMPTY, GROUP, TOMBSTONE
from hps.types import Array

if TYPE_CHECKING:
    import cupy

    from hps.cache.rows import RowStore

_SOURCE = r"""
// float16 bits to float32 in integer code (no cuda_fp16.h needed): exact, NaN bits kept.
__device__ float half_to_float(const unsigned short h)
{
    const unsigned int em = h & 0x7fffu;
    const unsigned int sign = (unsigned int)(h & 0x8000u) << 16;
    unsigned int bits = (em << 13) + (112u << 23);  // exponent bias 15 -> 127
    if (em >= 0x7c00u) {  // inf, nan
        bits += 112u << 23;
    } else if (em < 0x0400u) {  // zero, subnormal: renormalised by a float subtraction
        bits = __float_as_uint(__fsub_rn(__uint_as_float(bits + (1u << 23)),
                                         __uint_as_float(113u << 23)));
    }
    return __uint_as_float(bits | sign);
}

// The float32 at byte p of an int8 row (not 4-byte aligned unless dim is a multiple of 4).
__device__ float float_at(const unsigned char* p)
{
    return __uint_as_float((unsigned int)p[0] | ((unsigned int)p[1] << 8) |
                           ((unsigned int)p[2] << 16) | ((unsigned int)p[3] << 24));
}

extern "C" __global__ void probe_gather(
    const long long* slot_keys, const int* slot_rows, const long long gmask,
    const void* values, const int dim, const int width, const int format,
    const long long* keys, const long long n,
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
    if (format == FORMAT_FLOAT16) {
        const unsigned short* src = (const unsigned short*)values + row * width;
        for (int d = 0; d < dim; ++d) dst[d] = half_to_float(src[d]);
    } else if (format == FORMAT_INT8) {  // code * scale + offset, rounded twice as NumPy does
        const unsigned char* src = (const unsigned char*)values + row * width;
        const float scale = float_at(src + dim), offset = float_at(src + dim + 4);
        for (int d = 0; d < dim; ++d) dst[d] = __fadd_rn(__fmul_rn((float)src[d], scale), offset);
    } else {
        const float* src = (const float*)values + row * width;
        for (int d = 0; d < dim; ++d) dst[d] = src[d];
    }
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
        f"#define FORMAT_FLOAT16 {FORMAT_CODES['float16']}\n"
        f"#define FORMAT_INT8 {FORMAT_CODES['int8']}\n"
    )
    return defines + _SOURCE


@functools.lru_cache(maxsize=1)
def _kernel() -> cupy.RawKernel:
    import cupy

    return cupy.RawKernel(kernel_source(), "probe_gather")


def kernel_arguments(rows: RowStore, keys: Array, out: Array, tick: int, counts: Array | None,
                     cap: int, miss: Array, tallies: Array) -> tuple[object, ...]:  # fmt: skip
    """The kernel's arguments in its order, for arrays of ``rows.xp`` (device arrays here;
    host arrays where tests run the source compiled for the CPU): the arena of stored rows
    with its width and format code (:data:`hps.cache.kernels.FORMAT_CODES`), ``keys`` int64
    ``[n]``, ``out`` float32 ``[n, dim]``, ``miss`` int64 ``[>= n]``, ``tallies`` uint64 ``[2]``
    (zeros; the kernel adds the misses and the distinct hits)."""
    index = rows.index
    use_counts = counts is not None
    cd = counts if use_counts else rows.xp.zeros(1, dtype=np.int32)
    return (
        index.slot_keys, index.slot_rows, np.int64(index.gmask), rows.values,
        np.int32(rows.dim), np.int32(rows.width), np.int32(FORMAT_CODES[rows.fmt.name]),
        keys, np.int64(keys.shape[0]), out, rows.ticks.view(np.uint64),
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
