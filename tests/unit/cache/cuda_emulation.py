"""The GPU kernels' CUDA source compiled as C++ and run on the CPU, warps emulated honestly.

:func:`hps.cache.kernels_cupy.kernel_source` is wrapped in a prelude that defines CUDA's
built-ins, its atomics (real ones: ``__atomic`` builtins, only the overloads CUDA has) and its
warp intrinsics. Every lane of a launch is an OS thread (``std::thread``); the 32 lanes of a
warp meet at a barrier at each warp intrinsic (``__ballot_sync``, ``__any_sync``,
``__shfl_sync``, ``__syncwarp``), exchange their values there, and run freely in between, so
lanes and warps really interleave. A warp intrinsic that not all 32 lanes reach (divergence)
or a partial mask stops the process with a message instead of answering.

:class:`EmulatedDevice` is a :class:`hps.cache.device.Device` over host memory whose launches
call these builds (a small grid: the kernels loop grid-stride, so any grid must give the same
result), so the whole host path (staging, layouts, copies) runs too. Its stream is a queue,
as a GPU's: copies, fills and launches on it run in order only when the host waits
(``synchronize``), reading their sources then, and a copy into pinned host memory fills its
destination with 0xA5 until then, so a host read before the wait, or a pinned buffer
refilled while its copy is queued, gives wrong answers. A copy into pageable memory waits,
as the driver's does; a launch on the current stream (the write kernels) runs at once, after
what the queue holds, as the legacy default stream waits for a blocking stream. What this
cannot show (NVRTC's dialect, real warp scheduling) tests/unit/cache/test_kernel_nvrtc.py
and the GPU runs of the L1 tests cover.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hps.cache.device import Device, KernelArgs, gpu_device
from hps.cache.embedding_cache import EmbeddingCache
from hps.cache.gpu_rows import RowKernels
from hps.cache.kernels_cupy import GpuProbe, kernel_source
from hps.index import aligned_full
from hps.types import Array, ArrayModule

PRELUDE = r"""
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
struct Index3 { unsigned int x, y, z; };
static thread_local Index3 blockIdx, threadIdx;
static Index3 blockDim, gridDim;
#define __global__
#define __device__ static inline
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned int x, y; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
// one IEEE rounding each, as CUDA's intrinsics (-ffp-contract=off: no fused multiply-add)
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline int __popc(unsigned int x) { return __builtin_popcount(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
// CUDA's atomics, its overloads only, as real atomics: lanes and warps run concurrently.
#define ATOMICS(T) \
  static inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); } \
  static inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); } \
  static inline T atomicCAS(T* p, T expected, T v) { \
    __atomic_compare_exchange_n(p, &expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
    return expected; }
ATOMICS(int)
ATOMICS(unsigned int)
ATOMICS(unsigned long long)

struct Warp {  // the meeting point of a warp's 32 lanes
    std::atomic<int> arrived{0};
    std::atomic<unsigned long long> generation{0};
    unsigned long long value[32];
};
static thread_local Warp* this_warp;

static void warp_barrier() {  // the last lane to arrive opens the next generation
    Warp& w = *this_warp;
    const unsigned long long gen = w.generation.load(std::memory_order_acquire);
    if (w.arrived.fetch_add(1, std::memory_order_acq_rel) == 31) {
        w.arrived.store(0, std::memory_order_relaxed);
        w.generation.store(gen + 1, std::memory_order_release);
        return;
    }
    const auto start = std::chrono::steady_clock::now();
    for (unsigned long spins = 1; w.generation.load(std::memory_order_acquire) == gen; ++spins) {
        std::this_thread::yield();
        if (spins % 4096 == 0 &&
            std::chrono::steady_clock::now() - start > std::chrono::seconds(60)) {
            std::fprintf(stderr, "emulated warp: a lane never reached a warp intrinsic\n");
            std::_Exit(70);
        }
    }
}
static inline void full_mask(unsigned int mask) {
    if (mask != 0xffffffffu) {
        std::fprintf(stderr, "emulated warp: only full-warp masks are emulated\n");
        std::_Exit(71);
    }
}
static unsigned long long exchange(unsigned long long mine, int src) {
    Warp& w = *this_warp;
    w.value[threadIdx.x & 31] = mine;
    warp_barrier();
    const unsigned long long got = w.value[src & 31];
    warp_barrier();  // nobody writes the next value before every lane has read this one
    return got;
}
static inline unsigned int __ballot_sync(unsigned int mask, int pred) {
    full_mask(mask);
    Warp& w = *this_warp;
    w.value[threadIdx.x & 31] = pred ? 1 : 0;
    warp_barrier();
    unsigned int bits = 0;
    for (int i = 0; i < 32; ++i) bits |= (w.value[i] ? 1u : 0u) << i;
    warp_barrier();
    return bits;
}
static inline int __any_sync(unsigned int mask, int pred) { return __ballot_sync(mask, pred) != 0; }
template <class T> static inline T __shfl_sync(unsigned int mask, T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffled values are at most 8 bytes");
    full_mask(mask);
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = exchange(bits, src);
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}
static inline void __syncwarp(unsigned int mask = 0xffffffffu) { full_mask(mask); warp_barrier(); }

template <class F> static void run_grid(long long blocks, int threads, F body) {
    gridDim.x = (unsigned int)blocks;
    blockDim.x = (unsigned int)threads;
    const int warps = threads / 32;
    std::vector<Warp> meet(blocks * warps);
    std::vector<std::thread> lanes;
    for (long long b = 0; b < blocks; ++b) {
        for (int t = 0; t < threads; ++t) {
            lanes.emplace_back([&, b, t] {
                blockIdx.x = (unsigned int)b;
                threadIdx.x = (unsigned int)t;
                this_warp = &meet[b * warps + t / 32];
                body();
            });
        }
    }
    for (std::thread& lane : lanes) lane.join();
}
"""

_KERNEL = re.compile(r'extern "C" __global__ void (\w+)\((.*?)\)\s*\{', re.S)


def launchers(source: str) -> str:
    """A ``launch_<name>(blocks, threads, <its parameters>)`` for each kernel of ``source``,
    running it over the grid with :func:`run_grid`."""
    out = []
    for name, params in _KERNEL.findall(source):
        names = [re.search(r"(\w+)\s*$", p).group(1) for p in params.split(",")]  # type: ignore[union-attr]
        out.append(
            f'extern "C" void launch_{name}(long long blocks, int threads, {params})\n'
            f"{{ run_grid(blocks, threads, [&] {{ {name}({', '.join(names)}); }}); }}\n"
        )
    return "".join(out)


def build(folder: Path) -> ctypes.CDLL:
    """Compile the kernels with their launchers into a shared library in ``folder``."""
    compiler = shutil.which("g++")
    assert compiler, "g++ is needed to run the GPU kernels' source on the CPU (make test-tools)"
    source = kernel_source()
    path = folder / "kernels.cpp"
    path.write_text(PRELUDE + source + launchers(source))
    library = folder / "kernels.so"
    flags = ["-std=c++17", "-O1", "-ffp-contract=off", "-fno-strict-aliasing", "-pthread"]
    done = subprocess.run(
        [compiler, *flags, "-shared", "-fPIC", "-Wall", "-Werror", "-o", library, path],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return ctypes.CDLL(str(library))


_C_TYPES = {
    np.dtype(np.int64): ctypes.c_int64,
    np.dtype(np.int32): ctypes.c_int32,
    np.dtype(np.uint64): ctypes.c_uint64,
}


def _c_value(arg: Array | np.generic) -> object:
    """An array as its address, a NumPy scalar as the C type of its dtype."""
    if isinstance(arg, np.ndarray):
        return ctypes.c_void_p(arg.ctypes.data)
    return _C_TYPES[arg.dtype](arg.item())


GARBAGE = 0xA5  # what a pinned destination holds while its copy is queued


class EmulatedDevice(Device):
    """A :class:`Device` over host memory running the CPU build ``lib``: at most ``blocks``
    blocks of ``threads`` threads per launch, its stream a queue run at ``synchronize``
    (the module docstring). Counts its launches (as queued) and allocations."""

    xp = np

    def __init__(self, lib: ctypes.CDLL, blocks: int = 2, threads: int = 64) -> None:
        super().__init__()
        self.lib, self.blocks, self.threads = lib, blocks, threads
        self.launches: list[str] = []
        self.allocations = 0
        self._queue: list[Callable[[], None]] = []
        self._stream = threading.Lock()  # the queue's: one thread queues or runs it at a time
        self._pinned_memory: list[weakref.ref[np.ndarray]] = []

    def _alloc_pinned(self, nbytes: int) -> np.ndarray:
        self.allocations += 1
        buf = aligned_full(np, nbytes, GARBAGE, np.uint8)  # garbage that shows if read
        alive = [r for r in self._pinned_memory if r() is not None]
        self._pinned_memory = [*alive, weakref.ref(buf)]
        return buf

    def _alloc_device(self, nbytes: int) -> Array:
        self.allocations += 1
        return aligned_full(np, nbytes, 0x5A, np.uint8)

    def _is_pinned(self, a: np.ndarray) -> bool:
        """Whether ``a`` lies in one of the pinned buffers still alive."""
        at = a.ctypes.data
        alive = [b for b in (r() for r in self._pinned_memory) if b is not None]
        return any(b.ctypes.data <= at < b.ctypes.data + b.nbytes for b in alive)

    def _enqueue(self, step: Callable[[], None], garbage: np.ndarray | None = None) -> None:
        """Queue ``step``, ``garbage`` (a host destination) filled with 0xA5 until it runs."""
        with self._stream:
            if garbage is not None:
                garbage.view(np.uint8).fill(GARBAGE)
            self._queue.append(step)

    def to_device(self, dst: Array, src: np.ndarray) -> None:
        self._enqueue(lambda: np.copyto(dst, src))

    def to_host(self, dst: np.ndarray, src: Array) -> None:
        if not self._is_pinned(dst):  # pageable: the driver stages the copy and waits
            self.synchronize()
            np.copyto(dst, src)
            return
        self._enqueue(lambda: np.copyto(dst, src), garbage=dst)

    def zero(self, dst: Array) -> None:
        self._enqueue(lambda: dst.fill(0))

    def launch(self, name: str, blocks: int, threads: int, args: KernelArgs, *,
               own_stream: bool = True) -> None:  # fmt: skip
        self.launches.append(name)
        launch = getattr(self.lib, f"launch_{name}")
        queued = (list(map(_c_value, args)), args)  # the values now, the arrays kept alive

        def run() -> None:
            launch(ctypes.c_int64(min(blocks, self.blocks)), ctypes.c_int(self.threads),
                   *queued[0])  # fmt: skip

        if own_stream:
            self._enqueue(run)
            return
        with self._stream:  # the current stream: after what the device's stream holds, at once
            self._drain()
            run()

    def synchronize(self) -> None:
        """Run what the stream holds, in order."""
        with self._stream:
            self._drain()

    def _drain(self) -> None:
        """Run the queue (the stream's lock held)."""
        queue, self._queue = self._queue, []
        for step in queue:
            step()


def on_emulated_gpu(cache: EmbeddingCache, lib: ctypes.CDLL, tile: int | None = None,
                    device: EmulatedDevice | None = None) -> EmulatedDevice:  # fmt: skip
    """Make ``cache`` (on NumPy) run the GPU kernels of ``lib`` as a GPU cache would: the
    probe+gather and the row writes; returns its device."""
    device = device or EmulatedDevice(lib)
    cache._kernel = GpuProbe(device, tile)
    cache._rows.ops = RowKernels(device, tile)
    return device


class GpuCaches:
    """Caches that run the GPU kernels, on the machine's GPU or an emulated one: on CuPy
    (``lib`` None) the current GPU's shared device (:func:`hps.cache.device.gpu_device`), on
    NumPy an :class:`EmulatedDevice` running ``lib``. The tests of the GPU paths take one
    per usable array module (conftest's ``gpu``), so ``make gpu-check`` runs them on a GPU."""

    def __init__(self, xp: ArrayModule, lib: ctypes.CDLL | None) -> None:
        self.xp, self.lib = xp, lib

    def device(self) -> Device:
        """A new emulated device, or the GPU's shared one."""
        return gpu_device(None) if self.lib is None else EmulatedDevice(self.lib)

    def cache(self, dim: int, capacity: int, device: Device, **kwargs: object) -> EmbeddingCache:
        """A cache of ``dim`` x ``capacity`` (``EmbeddingCache``'s ``kwargs``) on ``device``."""
        if self.lib is None:
            cache = EmbeddingCache(dim, capacity, xp=self.xp, **kwargs)  # type: ignore[arg-type]
            assert isinstance(cache._kernel, GpuProbe) and cache._kernel.device is device
            return cache
        assert isinstance(device, EmulatedDevice)
        cache = EmbeddingCache(dim, capacity, **kwargs)  # type: ignore[arg-type]
        on_emulated_gpu(cache, self.lib, device=device)
        return cache
