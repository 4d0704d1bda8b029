"""Where the L1 GPU kernels run: one stream, staging buffers reused across calls.

A :class:`Device` keeps named pinned host buffers and device buffers that grow geometrically
(to the next power of two of what a call needs) and are never allocated per call, plus one
CUDA stream and one pinned response buffer (:meth:`Device.response`). A process has one per
GPU (:func:`gpu_device`), shared by every cache on that GPU, so what it holds is what the
largest request needed, whichever tables that request asked for: the figure ``hps plan``
prints per instance. A call that stages holds the device's :attr:`Device.lock` from its
first buffer to its wait (taken after the caches' locks, never before them).

A query copies its keys into pinned memory, sends them with one asynchronous copy, launches
the kernel, brings the rows straight into the caller's buffer and the miss list and tallies
into pinned memory, on that stream; the host waits once (:mod:`hps.cache.kernels_cupy`).
Where the answer leaves the process the caller's buffer is the response buffer (the
pipeline's host answers), so the rows cross the bus once, at its pinned speed, and no host
copy follows.

:class:`CupyDevice` is the real one. Everything it allocates, copies and launches runs under
its GPU's scope (``cupy.cuda.Device(gpu)``), whatever GPU the calling thread has current, so
a caller placed on another GPU (a ``KIND_CPU`` instance, a calibration) still gets buffers,
kernels and pooled rows on the cache's GPU. Its copies and launches go to its own stream,
created blocking; the caches' own array operations (inserts, evictions, the write kernels of
:mod:`hps.cache.gpu_rows`) run on CuPy's current stream, which must be CUDA's legacy default
stream. That is what orders the two: a blocking stream and the legacy default stream each
wait for what the other has queued, whichever thread queued it, so a launch on the device's
stream sees every write released before it, a write waits for a probe queued before it, and
a staging buffer (allocated from CuPy's pool on the default stream) is free before the
device's stream first writes it. The host waits for the stream before a query returns.
CuPy's per-thread default stream (``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``) or another
stream made current around cache operations would break that ordering: a device refuses to
start under the first and a launch refuses under either (:class:`hps.errors.ConfigError`).

Tests put an emulated device behind the same interface (host memory, the kernels' CUDA source
compiled for the CPU, copies and launches queued until the host waits:
tests/unit/cache/test_kernel_cuda_source.py), so the host path runs there too; a stand-in
for CuPy (tests/unit/cache/fake_cupy.py) checks the scope and the stream mode of this one.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import threading
import weakref
from collections.abc import Collection, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from hps.errors import ConfigError
from hps.types import Array, ArrayModule

if TYPE_CHECKING:
    import cupy

MIN_BUFFER = 1 << 12

KernelArgs: TypeAlias = tuple[Array | np.generic, ...]
"""A launch's arguments: arrays of the device's ``xp``, NumPy scalars typed as the kernel's
parameters (``numpy.uint64(0)`` for a null pointer)."""


def grown(nbytes: int) -> int:
    """The size a buffer of at least ``nbytes`` is allocated with: a power of two."""
    return max(MIN_BUFFER, 1 << max(0, nbytes - 1).bit_length())


@dataclass(frozen=True)
class Staging:
    """Bytes of staging buffers: page-locked (pinned) host memory and device memory."""

    pinned: int
    device: int


def staging_nbytes(pinned: Mapping[str, int], device: Mapping[str, int]) -> Staging:
    """What a :class:`Device` holds once its calls asked for at most ``pinned[name]`` bytes of
    the pinned buffer ``name`` and ``device[name]`` of the device buffer ``name``: each grown
    to a power of two (:func:`grown`), as :meth:`Device.pinned` and :meth:`Device.buffer`
    allocate them. The one sizing rule for ``hps plan`` and the tests."""
    return Staging(
        pinned=sum(grown(n) for n in pinned.values()),
        device=sum(grown(n) for n in device.values()),
    )


def address(a: Array) -> int:
    """The address of an array's first element (NumPy or CuPy)."""
    if isinstance(a, np.ndarray):
        return int(a.ctypes.data)
    return int(a.data.ptr)


class Device(abc.ABC):
    """Staging buffers, copies and launches on one stream (see the module docstring)."""

    xp: ArrayModule
    resident_threads: int = 1 << 24
    """Threads the device runs at once (more only queue): what a launch's grid is capped at."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held by a call from its first staging buffer to its wait
        self._pinned: dict[str, np.ndarray] = {}
        self._buffers: dict[str, Array] = {}
        self._response_lock = threading.Lock()
        self._response: np.ndarray | None = None
        self._response_out = False  # an answer in the response buffer is still referenced

    def pinned(self, name: str, nbytes: int) -> np.ndarray:
        """Pinned host bytes ``[nbytes]`` of the buffer ``name`` (grown when too small)."""
        buf = self._pinned.get(name)
        if buf is None or buf.size < nbytes:
            buf = self._pinned[name] = self._alloc_pinned(grown(nbytes))
        return buf[:nbytes]

    def buffer(self, name: str, nbytes: int) -> Array:
        """Device bytes ``[nbytes]`` of the buffer ``name`` (grown when too small; its
        contents are not kept when it grows)."""
        buf = self._buffers.get(name)
        if buf is None or buf.size < nbytes:
            self._buffers.pop(name, None)  # freed before the larger one is allocated
            buf = self._buffers[name] = self._alloc_device(grown(nbytes))
        return buf[:nbytes]

    def response(self, n: int) -> np.ndarray:
        """A float32 ``[n]`` host buffer for an answer that leaves the process (Triton
        copies it into its response): a view of the device's one pinned response buffer
        (grown as :meth:`pinned` grows), which the rows reach in one copy from the device.

        The buffer stays reserved until the last view of the returned array is gone (a
        DLPack consumer such as Triton's output tensor holds one until it has copied it), so
        no later answer overwrites one still being sent. A call that finds it reserved
        (another thread's answer still alive) gets ordinary memory instead: the device holds
        one response buffer, never one per request."""
        nbytes = 4 * n
        with self._response_lock:
            if self._response_out or n == 0:
                return np.empty(n, np.float32)
            if self._response is None or self._response.size < nbytes:
                self._response = None  # freed before the larger one is allocated
                self._response = self._alloc_pinned(grown(nbytes))
            self._response_out = True
            # frombuffer over a memoryview: every view of ``rows`` keeps ``rows`` itself
            # alive (NumPy stops collapsing bases at a non-array), so its end is the answer's
            rows = np.frombuffer(self._response.data[:nbytes], dtype=np.float32)
        weakref.finalize(rows, self._response_back)
        return rows

    def _response_back(self) -> None:
        self._response_out = False  # no lock: a finalizer may run inside response()

    def release(self) -> None:
        """Free every staging buffer (a later call grows them again), the response buffer
        too unless an answer in it is still referenced."""
        with self.lock, self._response_lock:
            self._pinned.clear()
            self._buffers.clear()
            if not self._response_out:
                self._response = None

    def scope(self) -> AbstractContextManager[object]:
        """A context in which ``xp`` allocates on this device (its GPU made current)."""
        return contextlib.nullcontext()

    def held(self) -> Staging:
        """Bytes its staging buffers hold now (pinned host, device), the response buffer
        with the pinned ones."""
        with self.lock:
            response = self._response
            return Staging(
                pinned=sum(int(b.nbytes) for b in self._pinned.values())
                + (0 if response is None else int(response.nbytes)),
                device=sum(int(b.nbytes) for b in self._buffers.values()),
            )

    @abc.abstractmethod
    def _alloc_pinned(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of pinned host memory (uint8), freed when the array is."""

    @abc.abstractmethod
    def _alloc_device(self, nbytes: int) -> Array:
        """``nbytes`` of device memory (uint8, 16-byte aligned at least)."""

    @abc.abstractmethod
    def to_device(self, dst: Array, src: np.ndarray) -> None:
        """Copy host ``src`` (pinned) to device ``dst`` (same size), asynchronously."""

    @abc.abstractmethod
    def to_host(self, dst: np.ndarray, src: Array) -> None:
        """Copy device bytes ``src`` to host bytes ``dst`` (uint8, same size): asynchronously
        into pinned memory; into pageable memory the driver stages it and the call waits."""

    @abc.abstractmethod
    def zero(self, dst: Array) -> None:
        """Set device bytes ``dst`` to zero, asynchronously."""

    @abc.abstractmethod
    def launch(self, name: str, blocks: int, threads: int, args: KernelArgs, *,
               own_stream: bool = True) -> None:  # fmt: skip
        """Run kernel ``name`` of :func:`hps.cache.kernels_cupy.kernel_source` on the
        device's stream (``own_stream``) or on the current one (the stream of the cache's
        array operations); ``args``: arrays of ``xp``, NumPy scalars typed as the kernel's
        parameters (``numpy.uint64(0)`` for a null pointer)."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Wait for everything queued on the stream."""


@functools.lru_cache(maxsize=1)
def _module() -> cupy.RawModule:
    import cupy

    from hps.cache.kernels_cupy import NVRTC_OPTIONS, kernel_source

    return cupy.RawModule(code=kernel_source(), options=NVRTC_OPTIONS)


PER_THREAD_STREAM = "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM"


class CupyDevice(Device):
    """A :class:`Device` on GPU ``gpu``: its buffers, copies and launches under that GPU's
    scope, its stream created on first use, the legacy default stream required (the module
    docstring; a :class:`hps.errors.ConfigError` at start otherwise)."""

    def __init__(self, gpu: int) -> None:
        import cupy

        super().__init__()
        self.xp = cupy
        self.gpu = gpu
        self._on_gpu = cupy.cuda.Device(gpu)  # a reusable context (CuPy keeps a stack per thread)
        self._stream: cupy.cuda.Stream | None = None
        with self._on_gpu:
            self._check_stream()
        props = cupy.cuda.runtime.getDeviceProperties(gpu)
        self.resident_threads = props["multiProcessorCount"] * props["maxThreadsPerMultiProcessor"]

    def scope(self) -> AbstractContextManager[object]:
        return self._on_gpu

    def _check_stream(self) -> None:
        """ConfigError unless the current stream (of the current GPU) is CUDA's legacy default
        stream, which orders the cache's writes with the device's stream (module docstring)."""
        ptr = int(self.xp.cuda.get_current_stream().ptr)
        if ptr != 0:
            raise ConfigError(
                f"L1 on GPU {self.gpu}: the current CUDA stream is {ptr:#x}, not the legacy "
                f"default stream its ordering relies on: unset {PER_THREAD_STREAM} (CuPy's "
                "per-thread default stream) and run no L1 operation under another stream"
            )

    @property
    def stream(self) -> cupy.cuda.Stream:
        if self._stream is None:
            with self._on_gpu:
                self._stream = self.xp.cuda.Stream(non_blocking=False)
        return self._stream

    def _alloc_pinned(self, nbytes: int) -> np.ndarray:
        # not from CuPy's pinned pool, which keeps every freed block: a buffer that grew
        # gives its old memory back, so what held() counts is what is pinned
        cuda = self.xp.cuda
        pinned = cuda.PinnedMemory(nbytes, cuda.runtime.hostAllocPortable)  # as CuPy's own
        memory = cuda.PinnedMemoryPointer(pinned, 0)
        return np.ndarray((nbytes,), dtype=np.uint8, buffer=memory)

    def _alloc_device(self, nbytes: int) -> Array:
        with self._on_gpu:
            return self.xp.empty(nbytes, dtype=self.xp.uint8)  # 256-byte aligned

    def to_device(self, dst: Array, src: np.ndarray) -> None:
        rt = self.xp.cuda.runtime
        with self._on_gpu:
            rt.memcpyAsync(address(dst), address(src), src.nbytes, rt.memcpyHostToDevice,
                           self.stream.ptr)  # fmt: skip

    def to_host(self, dst: np.ndarray, src: Array) -> None:
        rt = self.xp.cuda.runtime
        with self._on_gpu:
            rt.memcpyAsync(address(dst), address(src), dst.nbytes, rt.memcpyDeviceToHost,
                           self.stream.ptr)  # fmt: skip

    def zero(self, dst: Array) -> None:
        with self._on_gpu:
            self.xp.cuda.runtime.memsetAsync(address(dst), 0, dst.nbytes, self.stream.ptr)

    def launch(self, name: str, blocks: int, threads: int, args: KernelArgs, *,
               own_stream: bool = True) -> None:  # fmt: skip
        with self._on_gpu:
            self._check_stream()  # ordered with the cache's writes by the legacy stream only
            kernel = _module().get_function(name)  # CuPy loads the module once per GPU
            if not own_stream:
                kernel((blocks,), (threads,), args)
                return
            with self.stream:
                kernel((blocks,), (threads,), args)

    def synchronize(self) -> None:
        self.stream.synchronize()


_gpu_devices: dict[int, CupyDevice] = {}
_gpu_devices_lock = threading.Lock()


def gpu_device(device_id: int | None) -> CupyDevice:
    """The process's one :class:`CupyDevice` on GPU ``device_id`` (``None``: the current GPU),
    created on first use and shared by every cache on that GPU (the module docstring)."""
    if device_id is None:
        import cupy

        device_id = int(cupy.cuda.runtime.getDevice())
    with _gpu_devices_lock:
        device = _gpu_devices.get(device_id)
        if device is None:
            device = _gpu_devices[device_id] = CupyDevice(device_id)
        return device


def gpu_device_ids() -> frozenset[int]:
    """The GPUs the process has a :class:`CupyDevice` on now."""
    with _gpu_devices_lock:
        return frozenset(_gpu_devices)


def forget_gpu_devices(keep: Collection[int]) -> None:
    """Drop the process's devices on GPUs other than ``keep``, and with them their stream and
    staging buffers: a calibration on CuPy that lost to NumPy forgets the devices it created
    (no cache uses them), :func:`hps.cache.auto.choose_l1_device`."""
    with _gpu_devices_lock:
        for gpu in set(_gpu_devices) - set(keep):
            _gpu_devices.pop(gpu).release()


def held_staging() -> Staging:
    """What the process's GPU devices hold now, all GPUs together (per instance, what
    ``hps plan`` predicts; exported as ``hps_l1_staging_bytes``)."""
    with _gpu_devices_lock:
        devices = list(_gpu_devices.values())
    held = [device.held() for device in devices]
    return Staging(sum(h.pinned for h in held), sum(h.device for h in held))
