"""Where the L1 GPU kernels run: one stream, staging buffers reused across calls.

A :class:`Device` keeps named pinned host buffers and device buffers that grow geometrically
(to the next power of two of what a call needs) and are never allocated per call, plus one
CUDA stream. A process has one per GPU (:func:`gpu_device`), shared by every cache on that
GPU, so what it holds is what the largest request needed, whichever tables that request
asked for: the figure ``hps plan`` prints per instance. A call that stages holds the
device's :attr:`Device.lock` from its first buffer to its wait (taken after the caches'
locks, never before them). A query copies its keys into
pinned memory, sends them with one asynchronous copy, launches the kernel and brings the rows
(and the miss list and tallies after them) back with one asynchronous copy into pinned
memory, on that stream; the host waits once, then copies the rows once into the caller's
buffer (:mod:`hps.cache.kernels_cupy`).

:class:`CupyDevice` is the real one. A launch on its stream first waits for what the current
stream (where the cache's own array operations run: inserts, evictions) has queued, and the
host waits for the stream before a query returns, so neither sees the other half done. Tests put an
emulated device behind the same interface (host memory, the kernels' CUDA source compiled
for the CPU: tests/unit/cache/test_kernel_cuda_source.py), so the host path runs there too.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import threading
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

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

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held by a call from its first staging buffer to its wait
        self._pinned: dict[str, np.ndarray] = {}
        self._buffers: dict[str, Array] = {}

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

    def held(self) -> Staging:
        """Bytes its staging buffers hold now (pinned host, device)."""
        with self.lock:
            return Staging(
                pinned=sum(int(b.nbytes) for b in self._pinned.values()),
                device=sum(int(b.nbytes) for b in self._buffers.values()),
            )

    @abc.abstractmethod
    def _alloc_pinned(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of pinned host memory (uint8)."""

    @abc.abstractmethod
    def _alloc_device(self, nbytes: int) -> Array:
        """``nbytes`` of device memory (uint8, 16-byte aligned at least)."""

    @abc.abstractmethod
    def to_device(self, dst: Array, src: np.ndarray) -> None:
        """Copy host ``src`` (pinned) to device ``dst`` (same size), asynchronously."""

    @abc.abstractmethod
    def to_host(self, dst: np.ndarray, src: Array) -> None:
        """Copy device ``src`` to host ``dst`` (pinned, same size), asynchronously."""

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

    def on_stream(self) -> AbstractContextManager[object]:
        """A context in which ``xp``'s array operations run on the device's stream, in order
        with its copies and launches (host memory: they simply run)."""
        return contextlib.nullcontext()


@functools.lru_cache(maxsize=1)
def _module() -> cupy.RawModule:
    import cupy

    from hps.cache.kernels_cupy import NVRTC_OPTIONS, kernel_source

    return cupy.RawModule(code=kernel_source(), options=NVRTC_OPTIONS)


class CupyDevice(Device):
    """A :class:`Device` on GPU ``gpu`` (its stream is created on first use; its buffers are
    allocated under the calling cache's device scope, which is that GPU)."""

    def __init__(self, gpu: int) -> None:
        import cupy

        super().__init__()
        self.xp = cupy
        self.gpu = gpu
        self._stream: cupy.cuda.Stream | None = None

    @property
    def stream(self) -> cupy.cuda.Stream:
        if self._stream is None:
            with self.xp.cuda.Device(self.gpu):
                self._stream = self.xp.cuda.Stream(non_blocking=False)
        return self._stream

    def _alloc_pinned(self, nbytes: int) -> np.ndarray:
        import cupyx

        host: np.ndarray = cupyx.empty_pinned(nbytes, dtype=np.uint8)
        return host

    def _alloc_device(self, nbytes: int) -> Array:
        return self.xp.empty(nbytes, dtype=self.xp.uint8)  # 256-byte aligned

    def to_device(self, dst: Array, src: np.ndarray) -> None:
        rt = self.xp.cuda.runtime
        rt.memcpyAsync(address(dst), address(src), src.nbytes, rt.memcpyHostToDevice,
                       self.stream.ptr)  # fmt: skip

    def to_host(self, dst: np.ndarray, src: Array) -> None:
        rt = self.xp.cuda.runtime
        rt.memcpyAsync(address(dst), address(src), dst.nbytes, rt.memcpyDeviceToHost,
                       self.stream.ptr)  # fmt: skip

    def zero(self, dst: Array) -> None:
        self.xp.cuda.runtime.memsetAsync(address(dst), 0, dst.nbytes, self.stream.ptr)

    def launch(self, name: str, blocks: int, threads: int, args: KernelArgs, *,
               own_stream: bool = True) -> None:  # fmt: skip
        kernel = _module().get_function(name)
        if not own_stream:
            kernel((blocks,), (threads,), args)
            return
        # after whatever the current stream has queued (the cache's writes), in any stream mode
        self.stream.wait_event(self.xp.cuda.get_current_stream().record())
        with self.stream:
            kernel((blocks,), (threads,), args)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def on_stream(self) -> AbstractContextManager[object]:
        return self.stream  # a CuPy stream is the context that makes it current


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


def held_staging() -> Staging:
    """What the process's GPU devices hold now, all GPUs together (per instance, what
    ``hps plan`` predicts; exported as ``hps_l1_staging_bytes``)."""
    with _gpu_devices_lock:
        devices = list(_gpu_devices.values())
    held = [device.held() for device in devices]
    return Staging(sum(h.pinned for h in held), sum(h.device for h in held))
