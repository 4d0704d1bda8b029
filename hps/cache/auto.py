"""Where a model's L1 caches run: ``hps_cache.device`` resolved once per model at start-up.

- ``numpy`` / ``cupy``: as configured (``cupy`` without a usable GPU is a ``ConfigError``).
- ``auto``: without CuPy or a usable GPU, NumPy, and nothing is timed. With one, the host
  path on CuPy and the compiled CPU kernel on NumPy are both timed on a request of the
  model's configured size (:func:`hps.cache.calibrate.calibrate`: synthetic caches of its
  tables, a few repetitions, the median each; for a CTR instance with the rows left on the
  GPU, as it serves them) and the faster one is chosen; a tie goes to NumPy, which takes no
  GPU memory. When NumPy wins, what the CuPy side took goes back: the GPU's shared device,
  if the calibration created it (its staging buffers: no cache uses it), and the blocks of
  CuPy's memory pool the synthetic caches freed. If the CuPy side fails (NVRTC cannot
  compile the kernels, the driver or the GPU's memory fails), NumPy serves: a warning with
  the error, reason ``gpu_failed``, and the same release.

The choice is an :class:`L1Device`. :func:`hps.build.build_session` logs its
:meth:`L1Device.message` (one line per model) and keeps it in
``LookupSession.l1_devices``; a Triton model process exports it in ``/metrics``
(``hps_l1_device``, ``hps_l1_calibration_seconds``: :mod:`hps.triton.model.metrics`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from hps.cache.calibrate import calibrate, request_keys
from hps.cache.device import forget_gpu_devices, gpu_device_ids
from hps.cache.xp import device_scope, usable_cupy
from hps.config import ModelConfig
from hps.errors import ConfigError
from hps.types import ArrayModule

log = logging.getLogger(__name__)

Reason = Literal["configured", "no_gpu", "calibrated", "gpu_failed"]
# seconds of one request's L1 probe on an array module (tests inject fake ones)
Measure = Callable[[ArrayModule], float]


@dataclass(frozen=True)
class L1Device:
    """Where one model's L1 caches run, and why."""

    model: str
    device: Literal["numpy", "cupy"]
    reason: Reason  # as configured; auto without a GPU; by the two medians; the GPU failed
    keys: int = 0  # keys of the timed request (calibrated only)
    cupy_s: float | None = None  # median seconds of the request's probe on each path
    numpy_s: float | None = None
    failure: str = ""  # why the CuPy side failed (gpu_failed only)

    def message(self) -> str:
        """The start-up log line."""
        head = f"L1 of model {self.model} on {self.device}: hps_cache.device"
        if self.reason == "configured":
            return f"{head} is {self.device}"
        if self.reason == "no_gpu":
            return f"{head} is auto and there is no GPU (no usable CuPy and GPU): no calibration"
        if self.reason == "gpu_failed":
            return f"{head} is auto and the GPU path failed to calibrate ({self.failure})"
        faster = "the GPU" if self.device == "cupy" else "the CPU"
        return (
            f"{head} is auto and {faster} was faster for a request of {self.keys:,} keys "
            f"(medians: cupy {_us(self.cupy_s)}, numpy {_us(self.numpy_s)})"
        )


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:,.1f} us"


def choose_l1_device(
    model: ModelConfig,
    *,
    capacities: Sequence[int] | None = None,
    device_id: int | None = None,
    rows_on_device: bool = False,
    cupy: Callable[[], ArrayModule | None] = usable_cupy,
    measure: Measure | None = None,
) -> tuple[L1Device, ArrayModule]:
    """The array module for ``model``'s L1 caches and the :class:`L1Device` that says why.

    ``capacities`` (rows per table), ``device_id`` and ``rows_on_device`` (a CTR instance:
    its rows stay on the GPU) shape the calibration; ``cupy`` finds
    CuPy on a usable GPU (``None``: none); ``measure`` times one request on an array module
    (default: :func:`hps.cache.calibrate.calibrate`). Tests inject the last two.
    """
    device = model.hps_cache.device
    if device == "numpy":
        return L1Device(model.model, "numpy", "configured"), np
    cp = cupy()
    if device == "cupy":
        if cp is None:
            raise ConfigError(
                f"model {model.model}: hps_cache.device is 'cupy' but no usable GPU/CuPy was found"
            )
        return L1Device(model.model, "cupy", "configured"), cp
    if cp is None:
        return L1Device(model.model, "numpy", "no_gpu"), np

    def calibrated(xp: ArrayModule) -> float:
        return calibrate(
            model, xp, capacities=capacities, device_id=device_id, rows_on_device=rows_on_device
        )

    timed = measure if measure is not None else calibrated
    before = gpu_device_ids()
    found = _timed(model, timed, cp)  # returned: a failed calibration's frames are gone
    if found.device == "numpy":
        _give_back(cp, device_id, before)
    return found, cp if found.device == "cupy" else np


def _timed(model: ModelConfig, timed: Measure, cp: ArrayModule) -> L1Device:
    """Both paths timed, the faster chosen (a tie: NumPy); NumPy if the CuPy side fails."""
    try:
        cupy_s = timed(cp)
    except Exception as exc:  # NVRTC, the driver, out of memory ...: the CPU serves
        log.warning("model %s: L1 on the GPU failed to calibrate", model.model, exc_info=True)
        return L1Device(model.model, "numpy", "gpu_failed", failure=f"{type(exc).__name__}: {exc}")
    numpy_s = timed(np)
    choice: Literal["numpy", "cupy"] = "cupy" if cupy_s < numpy_s else "numpy"
    return L1Device(model.model, choice, "calibrated", sum(request_keys(model)), cupy_s, numpy_s)


def _give_back(cp: ArrayModule, device_id: int | None, before: Collection[int]) -> None:
    """What the CuPy calibration took, NumPy serving: the shared devices it created (GPUs
    not in ``before``; a device that was there serves another model's caches and keeps its
    buffers) and the free blocks of CuPy's memory pool on GPU ``device_id`` (the synthetic
    caches' arrays; blocks other arrays freed go too, CuPy allocates them again when asked).
    A failure here is logged: the GPU may be what failed."""
    try:
        forget_gpu_devices(before)
        with device_scope(cp, device_id):
            cp.get_default_memory_pool().free_all_blocks()
    except Exception:
        log.warning("L1: could not give back the GPU memory of a calibration", exc_info=True)
