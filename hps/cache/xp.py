"""The array module an L1 cache runs on: CuPy when a GPU is usable, NumPy otherwise.

The cache is written once against ``xp``; this module picks it at start-up and moves whole
batches between the host and the device (one transfer each way per batch).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from hps.errors import ConfigError
from hps.types import Array, ArrayModule

if TYPE_CHECKING:
    import cupy

log = logging.getLogger(__name__)

DEVICES = ("auto", "numpy", "cupy")


@functools.lru_cache(maxsize=1)
def _cupy_or_none() -> ArrayModule | None:
    """CuPy when it imports and sees at least one GPU; ``None`` otherwise (logged once)."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            log.info("cupy found no GPU; the L1 cache runs on numpy")
            return None
        cupy.zeros(1).sum()  # a kernel launch: the driver and the runtime really work
        return cupy
    except Exception as exc:  # ImportError, CUDARuntimeError, missing driver ...
        log.info("cupy unusable (%s); the L1 cache runs on numpy", exc)
        return None


def usable_cupy() -> ArrayModule | None:
    """CuPy when it imports and sees a working GPU, else ``None`` (checked once)."""
    return _cupy_or_none()


def select_xp(device: str = "auto") -> ArrayModule:
    """``numpy`` or ``cupy`` for ``hps_cache.device`` (``auto``: CuPy when a GPU is usable;
    a serving session resolves ``auto`` per model by calibration instead:
    :func:`hps.cache.auto.choose_l1_device`)."""
    if device == "numpy":
        return np
    if device not in DEVICES:
        raise ConfigError(f"hps_cache.device: {device!r} is not one of {DEVICES}")
    cp = _cupy_or_none()
    if cp is not None:
        return cp
    if device == "cupy":
        raise ConfigError("hps_cache.device is 'cupy' but no usable GPU/CuPy was found")
    return np


def available_xps() -> list[ArrayModule]:
    """Every array module usable here (NumPy, plus CuPy on a GPU): the tests run on each."""
    cp = _cupy_or_none()
    return [np] if cp is None else [np, cp]


def array_module(a: Array) -> ArrayModule:
    """The array module of ``a``: NumPy for a NumPy array, else CuPy (a device array)."""
    if isinstance(a, np.ndarray):
        return np
    import cupy

    return cupy


def to_host(a: Array) -> np.ndarray:
    """A NumPy array of ``a`` (a device-to-host copy for CuPy, a no-op for NumPy)."""
    if isinstance(a, np.ndarray):
        return a
    host: np.ndarray = a.get()  # a CuPy array (to mypy, Array is NumPy's)
    return host


def gpu_of(a: Array) -> int:
    """The GPU a CuPy array ``a`` is on."""
    device: cupy.cuda.Device = a.device  # a CuPy array (to mypy, Array is NumPy's)
    return int(device.id)


def to_xp(xp: ArrayModule, a: npt.ArrayLike) -> Array:
    """``a`` as an ``xp`` array (a host-to-device copy for CuPy, a no-op for NumPy)."""
    return xp.asarray(a)


def use_device(device_id: int) -> None:
    """Make GPU ``device_id`` CuPy's current device for this thread (a no-op without a
    usable CuPy): what a process placed on one GPU allocates lands there, not on GPU 0."""
    cp = _cupy_or_none()
    if cp is not None:
        cp.cuda.Device(device_id).use()


def device_scope(xp: ArrayModule, device_id: int | None) -> AbstractContextManager[object]:
    """A reusable context that makes ``device_id`` current for CuPy (a no-op otherwise)."""
    if xp is np or device_id is None:
        return contextlib.nullcontext()
    return xp.cuda.Device(device_id)
