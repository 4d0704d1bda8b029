"""``hps_cache.device``: the choice per model (hps.cache.auto) and its calibration.

The choice is tested with injected measurements (a stand-in for CuPy and fake medians); the
calibration with a fake clock; the path without a GPU for real (with one, the same tests
calibrate for real and check that the faster path was taken); a CuPy side that fails, and
what a calibration that lost to NumPy gives back, with the stand-in (fake_cupy).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hps.build import build_session
from hps.cache.auto import L1Device, choose_l1_device
from hps.cache.calibrate import MAX_ROWS, calibrate, request_keys, synthetic_rows
from hps.cache.device import gpu_device, gpu_device_ids
from hps.cache.xp import usable_cupy
from hps.config import ModelConfig
from hps.errors import ConfigError
from tests.helpers import make_config
from tests.unit.cache import fake_cupy

FAKE_CUPY: Any = fake_cupy.FakeCupy()


def model(device: str = "auto", **extra: Any) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "model": "ctr",
            "embedding_table_names": ["a", "b"],
            "embedding_vecsize_per_table": [16, 8],
            "maxnum_catfeature_query_per_table_per_sample": [26, 1],
            "max_batch_size": 32,
            "hps_cache": {"device": device},
            **extra,
        }
    )


def never(*_: object) -> float:
    raise AssertionError("nothing may be timed here")


def medians(cupy_s: float, numpy_s: float) -> Any:
    def measure(xp: Any) -> float:
        return cupy_s if xp is FAKE_CUPY else numpy_s

    return measure


def test_auto_picks_the_faster_path_by_the_medians() -> None:
    choice, xp = choose_l1_device(
        model(), cupy=lambda: FAKE_CUPY, measure=medians(0.000_812, 0.003_627)
    )
    assert xp is FAKE_CUPY
    assert choice == L1Device("ctr", "cupy", "calibrated", 26 * 32 + 32, 0.000_812, 0.003_627)
    assert choice.message() == (
        "L1 of model ctr on cupy: hps_cache.device is auto and the GPU was faster for a "
        "request of 864 keys (medians: cupy 812.0 us, numpy 3,627.0 us)"
    )
    choice, xp = choose_l1_device(model(), cupy=lambda: FAKE_CUPY, measure=medians(0.004, 0.002))
    assert xp is np and (choice.device, choice.reason) == ("numpy", "calibrated")
    assert "the CPU was faster" in choice.message() and "numpy 2,000.0 us" in choice.message()
    choice, xp = choose_l1_device(model(), cupy=lambda: FAKE_CUPY, measure=medians(0.001, 0.001))
    assert xp is np and choice.device == "numpy"  # a tie: no GPU memory taken


def test_a_configured_device_is_not_timed() -> None:
    choice, xp = choose_l1_device(model("numpy"), cupy=never, measure=never)  # type: ignore[arg-type]
    assert xp is np and choice == L1Device("ctr", "numpy", "configured")
    assert choice.message() == "L1 of model ctr on numpy: hps_cache.device is numpy"
    choice, xp = choose_l1_device(model("cupy"), cupy=lambda: FAKE_CUPY, measure=never)
    assert xp is FAKE_CUPY and (choice.device, choice.reason) == ("cupy", "configured")
    with pytest.raises(ConfigError, match="model ctr: hps_cache.device is 'cupy' but no usable"):
        choose_l1_device(model("cupy"), cupy=lambda: None, measure=never)


def test_without_a_gpu_auto_takes_numpy_untimed() -> None:
    choice, xp = choose_l1_device(model(), cupy=lambda: None, measure=never)
    assert xp is np and choice == L1Device("ctr", "numpy", "no_gpu")
    assert "is auto and there is no GPU" in choice.message()


def test_auto_on_this_machine_for_real() -> None:
    """No GPU: NumPy, nothing timed. With one: both paths calibrated, the faster taken."""
    choice, xp = choose_l1_device(model())
    if usable_cupy() is None:
        assert xp is np and (choice.reason, choice.cupy_s, choice.numpy_s) == ("no_gpu", None, None)
    else:
        assert choice.reason == "calibrated" and choice.cupy_s and choice.numpy_s
        assert (choice.device == "cupy") == (choice.cupy_s < choice.numpy_s)
        assert xp.__name__ == choice.device


def test_the_calibration_takes_the_median_of_its_repetitions() -> None:
    ticks = iter([0.0, 1.0, 10.0, 13.0, 20.0, 22.0, 30.0, 30.5, 40.0, 49.0])
    seconds = calibrate(model(), np, repeats=5, timer=lambda: next(ticks))
    assert seconds == 2.0  # of 1, 3, 2, 0.5, 9
    with pytest.raises(ValueError, match="at least one repetition"):
        calibrate(model(), np, repeats=0)


def test_the_calibration_runs_the_configured_request() -> None:
    assert request_keys(model()) == [26 * 32, 32]
    assert request_keys(model(maxnum_catfeature_query_per_table_per_sample=[])) == [32, 32]
    assert synthetic_rows(model()) == [MAX_ROWS, MAX_ROWS]  # (64 + 32) B x 2^18 < 64 MiB
    assert synthetic_rows(model(), [5000, 2]) == [5000, 2]
    wide = model(embedding_vecsize_per_table=[1024, 1024])
    assert synthetic_rows(wide) == [(64 << 20) // 8192] * 2
    assert calibrate(model(hps_row_dtype="int8"), np, capacities=[4096, 1024], repeats=2) > 0


def test_build_session_logs_and_keeps_the_choice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    doc = model().model_dump(exclude={"version"})
    doc.update(gpucache=True, model="demo")
    cfg = make_config(tmp_path, models=[doc, {**doc, "model": "off", "gpucache": False}])
    with caplog.at_level(logging.INFO, logger="hps.build"):
        session = build_session(cfg)
    try:
        choice = session.l1_devices["demo"]
        assert set(session.l1_devices) == {"demo"}
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("L1 of")]
        assert lines == [choice.message()]
        caches = [session.caches[f"demo.{t}"] for t in ("a", "b")]
        assert {c.xp.__name__ for c in caches} == {choice.device}  # type: ignore[attr-defined]
        if usable_cupy() is None:
            assert choice.reason == "no_gpu"
    finally:
        session.close()


class CompileException(Exception):
    """As NVRTC's, raised through CuPy."""


def test_a_gpu_path_that_fails_to_calibrate_leaves_numpy_serving(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """NVRTC (or the driver, or the GPU's memory) fails while the CuPy side is timed: the
    instance starts on NumPy, with a warning and the reason in the choice (and so in
    ``hps_l1_device``), and the GPU memory the attempt took goes back."""
    cp = fake_cupy.install(monkeypatch)

    def measure(xp: Any) -> float:
        if xp is np:
            raise AssertionError("NumPy needs no timing once the GPU failed")
        gpu_device(1).buffer("keys", 1 << 20)  # staging grown before the failure
        raise CompileException("kernels.cu(12): error: identifier undefined")

    with caplog.at_level(logging.WARNING, logger="hps.cache.auto"):
        choice, xp = choose_l1_device(model(), device_id=1, cupy=lambda: cp, measure=measure)
    assert xp is np
    failure = "CompileException: kernels.cu(12): error: identifier undefined"
    assert choice == L1Device("ctr", "numpy", "gpu_failed", failure=failure)
    assert choice.message() == (
        f"L1 of model ctr on numpy: hps_cache.device is auto and the GPU path failed to "
        f"calibrate ({failure})"
    )
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warned and warned[0].exc_info and warned[0].exc_info[0] is CompileException
    assert gpu_device_ids() == frozenset()  # the device it created, with its buffers
    assert [e for e in cp.events if e.what == "pool:free"] == [fake_cupy.Event("pool:free", 1)]


def test_a_calibration_that_numpy_wins_gives_the_gpu_memory_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The device the calibration created goes (its staging buffers with it), one that
    another model's caches use stays, and CuPy's pool frees its blocks on that GPU; when
    CuPy wins, all of it stays for serving."""
    cp = fake_cupy.install(monkeypatch)
    kept = gpu_device(0)  # another model's caches are on GPU 0 already
    kept.buffer("keys", 4096)

    def measure(cupy_s: float) -> Any:
        def timed(xp: Any) -> float:
            if xp is np:
                return 0.001
            for gpu in (0, 1):  # the calibration's request grows both GPUs' staging
                gpu_device(gpu).buffer("out", 1 << 16)
            return cupy_s

        return timed

    choice, xp = choose_l1_device(model(), device_id=1, cupy=lambda: cp, measure=measure(0.002))
    assert xp is np and choice.reason == "calibrated"
    assert gpu_device_ids() == {0} and gpu_device(0) is kept
    assert kept.held().device == 4096 + (1 << 16)
    assert [e for e in cp.events if e.what == "pool:free"] == [fake_cupy.Event("pool:free", 1)]
    cp.events.clear()
    choice, xp = choose_l1_device(model(), device_id=1, cupy=lambda: cp, measure=measure(0.0005))
    assert xp is cp and gpu_device_ids() == {0, 1}
    assert not [e for e in cp.events if e.what == "pool:free"]
