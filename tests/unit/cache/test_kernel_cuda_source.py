"""The GPU kernel's CUDA source, compiled as C++ and run one thread at a time on the CPU.

Most runs get no GPU, so the CuPy kernel would otherwise never run before it reaches one.
Here its source (:func:`hps.cache.kernels_cupy.kernel_source`) is wrapped in a prelude that
defines CUDA's built-ins (``blockIdx``, ``threadIdx``, ``blockDim``, ``__global__``) and
its atomics (serial here), and a launcher that walks the grid thread by thread. A cache
whose kernel is that launcher (arguments assembled by the same
:func:`~hps.cache.kernels_cupy.kernel_arguments` as on a GPU) must match the NumPy
reference path exactly: rows, miss positions, distinct hits, ticks, counts and stats.

What this cannot show (atomics under real concurrency, NVRTC's dialect) the GPU tests
check where a GPU is lent (tests/unit/cache/conftest.py runs every L1 test on CuPy there).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hps.cache.embedding_cache import EmbeddingCache
from hps.cache.kernels_cupy import THREADS, kernel_arguments, kernel_source
from hps.rowformat import FORMATS, RowFormat
from tests.unit.cache.test_fused_property import (
    CACHE_CASES,
    SETTINGS,
    _pair,
    match_the_reference,
)

PRELUDE = r"""
#include <cstring>
struct Index3 { unsigned int x, y, z; };
static Index3 blockIdx, threadIdx, blockDim;
#define __global__
#define __device__ static
static float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
static unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
// one IEEE rounding each, as CUDA's intrinsics (-ffp-contract=off: no fused multiply-add)
static float __fmul_rn(float a, float b) { return a * b; }
static float __fadd_rn(float a, float b) { return a + b; }
static float __fsub_rn(float a, float b) { return a - b; }
template <class T> static T atomicAdd(T* p, T v) { T old = *p; *p = old + v; return old; }
template <class T> static T atomicExch(T* p, T v) { T old = *p; *p = v; return old; }
template <class T> static T atomicCAS(T* p, T expected, T v) {
    T old = *p; if (old == expected) *p = v; return old;
}
"""

LAUNCHER = r"""
extern "C" void launch(
    long long blocks, int threads,
    const long long* slot_keys, const int* slot_rows, const long long gmask,
    const void* values, const int dim, const int width, const int format,
    const long long* keys, const long long n,
    float* out, unsigned long long* ticks, const unsigned long long tick,
    int* counts, const int use_counts, const int cap,
    long long* miss_pos, unsigned long long* n_miss, unsigned long long* n_hit)
{
    blockDim.x = threads;
    // the last thread first: serial atomics see the threads in an order no GPU promises
    for (long long b = blocks - 1; b >= 0; --b) {
        for (int t = threads - 1; t >= 0; --t) {
            blockIdx.x = (unsigned int)b;
            threadIdx.x = (unsigned int)t;
            probe_gather(slot_keys, slot_rows, gmask, values, dim, width, format, keys, n, out,
                         ticks, tick, counts, use_counts, cap, miss_pos, n_miss, n_hit);
        }
    }
}
"""

_C_TYPES = {
    np.dtype(np.int64): ctypes.c_int64,
    np.dtype(np.int32): ctypes.c_int32,
    np.dtype(np.uint64): ctypes.c_uint64,
}


def _c_value(arg: Any) -> object:
    """An array as its address, a NumPy scalar as the C type of its dtype."""
    if isinstance(arg, np.ndarray):
        return ctypes.c_void_p(arg.ctypes.data)
    return _C_TYPES[arg.dtype](arg)


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., None]:
    compiler = shutil.which("g++")
    assert compiler, "g++ is needed to run the GPU kernel's source on the CPU (make test-tools)"
    folder = tmp_path_factory.mktemp("cuda-source")
    source = Path(folder, "probe_gather.cpp")
    source.write_text(PRELUDE + kernel_source() + LAUNCHER)
    library = folder / "probe_gather.so"
    subprocess.run(
        [
            compiler,
            "-O1",
            "-ffp-contract=off",
            "-shared",
            "-fPIC",
            "-Wall",
            "-Werror",
            "-o",
            library,
            source,
        ],  # fmt: skip
        check=True,
        capture_output=True,
    )
    fn: Callable[..., None] = ctypes.CDLL(str(library)).launch
    return fn


def emulated(launch: Callable[..., None]) -> Callable[..., tuple[np.ndarray, int]]:
    """The CPU build of the GPU kernel behind ``run_cupy``'s signature (host arrays)."""

    def run(rows: Any, keys: np.ndarray, out: np.ndarray, tick: int, counts: Any,
            cap: int) -> tuple[np.ndarray, int]:  # fmt: skip
        n = int(keys.shape[0])
        miss = np.full(max(n, 1), -1, dtype=np.int64)
        tallies = np.zeros(2, dtype=np.uint64)
        if n:
            args = kernel_arguments(rows, keys, out, tick, counts, cap, miss, tallies)
            launch(
                ctypes.c_int64((n + THREADS - 1) // THREADS),
                ctypes.c_int(THREADS),
                *map(_c_value, args),
            )
        n_miss, n_hit = (int(t) for t in tallies)
        return np.sort(miss[:n_miss]), n_hit

    return run


@SETTINGS
@CACHE_CASES
def test_the_cuda_source_matches_the_reference(
    launch: Callable[..., None],
    policy: str,
    dim: int,
    capacity: int,
    resident: list[int],
    queries: list[list[int]],
    row_dtype: str,
) -> None:
    gpu, ref = _pair(policy, dim, capacity, row_dtype)
    gpu._kernel = emulated(launch)
    match_the_reference(gpu, ref, resident, queries)


def test_the_cuda_source_caps_access_counts(launch: Callable[..., None]) -> None:
    """LFU counts stop at the policy's cap, as on the CPU: many hits of one row in a call
    (more threads than the cap), then the count is exactly the cap."""
    gpu = EmbeddingCache(4, 8, policy="lfu")
    gpu._kernel = emulated(launch)
    gpu.insert(np.array([7], np.int64), np.ones((1, 4), np.float32), force=True)
    counts, cap = gpu.policy.access_counts()  # type: ignore[misc]
    keys = np.full(3 * THREADS, 7, dtype=np.int64)
    counts[:] = cap - 5
    miss, hits = gpu.query_into(keys, np.empty((keys.size, 4), np.float32))
    assert miss.size == 0 and hits == 1
    row = int(gpu._rows.lookup(np.array([7], np.int64))[0])
    assert counts[row] == cap


def test_the_cuda_source_dequantizes_as_decode(launch: Callable[..., None]) -> None:
    """float16 (every one of its values) and int8 rows (every alignment of the scale and
    offset) come out of the kernel as ``RowFormat.decode`` gives them, bit for bit."""
    fmt16 = FORMATS["float16"]
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).reshape(256, 256)
    cases: list[tuple[RowFormat, np.ndarray]] = [(fmt16, halves)]
    rng = np.random.default_rng(5)
    for dim in (1, 2, 3, 5, 8, 67):
        rows = rng.standard_normal((16, dim)).astype(np.float32) * np.float32(100)
        rows[3] = 1.5  # a constant row: scale 0
        cases.append((FORMATS["int8"], FORMATS["int8"].encode(rows)))
    for fmt, stored in cases:
        n, dim = stored.shape[0], stored.shape[1] - (fmt.width(0))
        gpu = EmbeddingCache(dim, n, fmt=fmt)
        gpu._kernel = emulated(launch)
        keys = np.arange(n, dtype=np.int64)
        gpu.insert(keys, stored)
        out = np.empty((n + 1, dim), np.float32)
        miss, hits = gpu.query_into(np.append(keys[::-1], 10**9), out)
        assert miss.tolist() == [n] and hits == n
        want = fmt.decode(stored[::-1], dim)
        np.testing.assert_array_equal(out[:n].view(np.uint32), want.view(np.uint32))
        assert not out[n].any()
