"""Where a model's L1 caches run: ``hps_cache.device`` resolved once per model at start-up.

- ``numpy`` / ``cupy``: as configured (``cupy`` without a usable GPU is a ``ConfigError``).
- ``auto``: without CuPy or a usable GPU, NumPy, and nothing is timed. With one, the host
  path on CuPy and the compiled CPU kernel on NumPy are both timed on a request of the
  model's configured size (:func:`hps.cache.calibrate.calibrate`: synthetic caches of its
  tables, a few repetitions, the median each; for a CTR instance with the rows left on the
  GPU, as it serves them) and the faster one is chosen; a tie goes to NumPy, which takes no
  GPU memory.

The choice is an :class:`L1Device`. :func:`hps.build.build_session` logs its
:meth:`L1Device.message` (one line per model) and keeps it in
``LookupSession.l1_devices``; a Triton model process exports it in ``/metrics``
(``hps_l1_device``, ``hps_l1_calibration_seconds``: :mod:`hps.triton.model.metrics`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from hps.cache.calibrate import calibrate, request_keys
from hps.cache.xp import usable_cupy
from hps.config import ModelConfig
from hps.errors import ConfigError
from hps.types import ArrayModule

Reason = Literal["configured", "no_gpu", "calibrated"]
# seconds of one request's L1 probe on an array module (tests inject fake ones)
Measure = Callable[[ArrayModule], float]


@dataclass(frozen=True)
class L1Device:
    """Where one model's L1 caches run, and why."""

    model: str
    device: Literal["numpy", "cupy"]
    reason: Reason  # as configured; auto without a GPU; auto, by the two medians
    keys: int = 0  # keys of the timed request (calibrated only)
    cupy_s: float | None = None  # median seconds of the request's probe on each path
    numpy_s: float | None = None

    def message(self) -> str:
        """The start-up log line."""
        head = f"L1 of model {self.model} on {self.device}: hps_cache.device"
        if self.reason == "configured":
            return f"{head} is {self.device}"
        if self.reason == "no_gpu":
            return f"{head} is auto and there is no GPU (no usable CuPy and GPU): no calibration"
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
    cupy_s, numpy_s = timed(cp), timed(np)
    choice: Literal["numpy", "cupy"] = "cupy" if cupy_s < numpy_s else "numpy"
    keys = sum(request_keys(model))
    found = L1Device(model.model, choice, "calibrated", keys, cupy_s, numpy_s)
    return found, cp if choice == "cupy" else np
