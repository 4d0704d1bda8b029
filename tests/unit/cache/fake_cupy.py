"""A stand-in for CuPy on a machine without a GPU, to check which GPU the code runs on.

CuPy allocates every array, and launches every kernel, on the *current* GPU (the innermost
``cupy.cuda.Device`` scope of the thread), whatever GPU the data belongs to; a caller placed
on GPU 0 that builds or queries a cache of GPU 1 outside that GPU's scope puts its arrays on
the wrong one, which nothing on a one-GPU machine (or none) shows. :class:`FakeCupy` is NumPy
under CuPy's names with several "GPUs" of host memory and CuPy's notion of the current GPU
and stream: arrays made through it (:class:`DeviceArray`) remember the GPU that was current,
and it records (:attr:`FakeCupy.events`) every array made, copy, fill, launch and pool
release with the GPU current then. Launches run the kernels' CUDA source built for the CPU
(``cuda_lib``, :mod:`tests.unit.cache.cuda_emulation`), so a cache on it answers for real and
:class:`hps.cache.device.CupyDevice` (its scopes, its stream checks) runs unchanged.

It is not an emulation of a GPU's timing: copies and launches run at once (the emulated
device, ``EmulatedDevice``, is the one that queues them until the host waits). Install it
with :func:`install`, which puts it (and ``cupyx``) in ``sys.modules`` for one test.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from hps.cache import device as device_module
from hps.index import aligned_full

PER_THREAD = 2  # CUDA's cudaStreamPerThread handle
PROPERTIES = {"multiProcessorCount": 2, "maxThreadsPerMultiProcessor": 256}  # 2 blocks


@dataclass(frozen=True)
class Event:
    """Something the code did through the stand-in, and the GPU current then."""

    what: str  # "array:<function>", "copy", "fill", "launch:<kernel>", "pool:free"
    gpu: int
    stream: int = 0  # the stream it was queued on (copies, fills, launches)


class DeviceArray(np.ndarray):
    """A NumPy array that remembers the GPU it was made on (``.device.id``, as CuPy's)."""

    gpu: int = -1

    def __array_finalize__(self, obj: object) -> None:
        self.gpu = getattr(obj, "gpu", -1)

    @property
    def device(self) -> Any:  # type: ignore[override]
        return SimpleNamespace(id=self.gpu)


class FakeCupy(ModuleType):
    """NumPy under CuPy's names, ``gpus`` GPUs of host memory (see the module docstring).
    ``per_thread``: as under ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``."""

    def __init__(self, lib: ctypes.CDLL | None = None, gpus: int = 2) -> None:
        super().__init__("cupy")
        self.lib = lib
        self.gpus = gpus
        self.per_thread = False
        self.events: list[Event] = []
        self._local = threading.local()
        self._streams = itertools.count(0x100)
        owner = self

        class Device:
            def __init__(self, gpu: int) -> None:
                assert 0 <= gpu < owner.gpus, f"no GPU {gpu}"
                self.id = gpu

            def __enter__(self) -> Device:
                owner._stack().append(owner.current)
                owner._local.gpu = self.id
                return self

            def __exit__(self, *_: object) -> None:
                owner._local.gpu = owner._stack().pop()

            def use(self) -> None:
                owner._local.gpu = self.id

        class Stream:
            def __init__(self, non_blocking: bool = False, ptr: int | None = None) -> None:
                self.non_blocking = non_blocking
                self.ptr = next(owner._streams) if ptr is None else ptr

            def __enter__(self) -> Stream:
                owner._stream_stack().append(owner.stream_ptr())
                owner._local.stream = self.ptr
                return self

            def __exit__(self, *_: object) -> None:
                owner._local.stream = owner._stream_stack().pop()

            def synchronize(self) -> None:
                """Copies and launches ran at once."""

        runtime = SimpleNamespace(
            getDevice=lambda: self.current,
            getDeviceCount=lambda: gpus,
            getDeviceProperties=lambda gpu: dict(PROPERTIES),
            memcpyHostToDevice=1,
            memcpyDeviceToHost=2,
            hostAllocPortable=1,
            streamPerThread=PER_THREAD,
            memcpyAsync=self._copy,
            memsetAsync=self._fill,
        )
        self.cuda = SimpleNamespace(
            Device=Device,
            Stream=Stream,
            get_current_stream=lambda device_id=-1: SimpleNamespace(ptr=self.stream_ptr()),
            runtime=runtime,
            PinnedMemory=lambda nbytes, flags: aligned_full(np, nbytes, 0, np.uint8),
            PinnedMemoryPointer=lambda memory, offset: memory[offset:],
        )
        self.ndarray = DeviceArray
        self.RawModule = lambda code, options: SimpleNamespace(get_function=self._kernel)
        self.get_default_memory_pool = lambda: SimpleNamespace(free_all_blocks=self._free_pool)

    # -- the current GPU and stream, per thread, as CuPy keeps them ----------------------

    @property
    def current(self) -> int:
        return int(getattr(self._local, "gpu", 0))

    def stream_ptr(self) -> int:
        default = PER_THREAD if self.per_thread else 0
        return int(getattr(self._local, "stream", default))

    def _stack(self) -> list[int]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack  # type: ignore[no-any-return]

    def _stream_stack(self) -> list[int]:
        if not hasattr(self._local, "streams"):
            self._local.streams = []
        return self._local.streams  # type: ignore[no-any-return]

    def gpus_of(self, prefix: str) -> set[int]:
        """The GPUs current at the events whose name starts with ``prefix``."""
        return {e.gpu for e in self.events if e.what.startswith(prefix)}

    # -- NumPy's functions, their arrays made on the current GPU ------------------------

    def __getattr__(self, name: str) -> Any:
        attr = getattr(np, name)
        if not callable(attr) or isinstance(attr, type):
            return attr  # dtypes, constants

        @functools.wraps(attr)
        def on_gpu(*args: Any, **kwargs: Any) -> Any:
            return self._made(name, attr(*args, **kwargs))

        return on_gpu

    def _made(self, name: str, result: Any) -> Any:
        if isinstance(result, tuple):
            return tuple(self._made(name, r) for r in result)
        if not isinstance(result, np.ndarray):
            return result
        self.events.append(Event(f"array:{name}", self.current))
        out = result.view(DeviceArray)
        out.gpu = self.current
        return out

    # -- the runtime: copies, fills, launches, the pool ---------------------------------

    def _copy(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        self.events.append(Event("copy", self.current, stream))
        ctypes.memmove(dst, src, nbytes)

    def _fill(self, dst: int, value: int, nbytes: int, stream: int) -> None:
        self.events.append(Event("fill", self.current, stream))
        ctypes.memset(dst, value, nbytes)

    def _free_pool(self) -> None:
        self.events.append(Event("pool:free", self.current))

    def _kernel(self, name: str) -> Callable[..., None]:
        from tests.unit.cache.cuda_emulation import _c_value

        def launch(grid: tuple[int], block: tuple[int], args: tuple[Any, ...]) -> None:
            gpu = self.current
            self.events.append(Event(f"launch:{name}", gpu, self.stream_ptr()))
            elsewhere = [a.gpu for a in args if isinstance(a, DeviceArray) and a.gpu != gpu]
            assert not elsewhere, f"{name} launched on GPU {gpu} with arrays of GPUs {elsewhere}"
            assert self.lib is not None, "no kernels to run (FakeCupy(lib))"
            run = getattr(self.lib, f"launch_{name}")
            run(ctypes.c_int64(min(grid[0], 2)), ctypes.c_int(64), *map(_c_value, args))

        return launch


def install(monkeypatch: pytest.MonkeyPatch, lib: ctypes.CDLL | None = None) -> FakeCupy:
    """A :class:`FakeCupy` as ``cupy`` (and ``cupyx``) for one test, with a fresh set of
    shared devices (:func:`hps.cache.device.gpu_device`) and kernel module; GPU 0 current."""
    fake = FakeCupy(lib)
    cupyx = ModuleType("cupyx")
    cupyx.scatter_max = lambda target, index, value: np.maximum.at(target, index, value)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    monkeypatch.setattr(device_module, "_gpu_devices", {})
    # a kernel module of its own: the real CuPy's, where there is one, stays cached
    fresh = functools.lru_cache(maxsize=1)(device_module._module.__wrapped__)
    monkeypatch.setattr(device_module, "_module", fresh)
    return fake
