"""ModelProcess.answer against a stand-in for the Python backend's stub API: a request
cancelled while it waited is answered CANCELLED and never computed."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

PB_UTILS = "triton_python_backend_utils"
PROCESS = "hps.triton.model.process"


class TritonError:
    CANCELLED, INVALID_ARG, INTERNAL = "CANCELLED", "INVALID_ARG", "INTERNAL"

    def __init__(self, message: str, code: str = INTERNAL) -> None:
        self.message, self.code = message, code


class InferenceResponse:
    def __init__(self, output_tensors: list[Any], error: TritonError | None = None) -> None:
        self.output_tensors, self.error = output_tensors, error


class Tensor:
    @staticmethod
    def from_dlpack(name: str, array: np.ndarray) -> tuple[str, np.ndarray]:
        return name, np.from_dlpack(array)


class Request:
    def __init__(self, cancelled: bool) -> None:
        self.cancelled = cancelled

    def is_cancelled(self) -> bool:
        return self.cancelled

    def requested_output_names(self) -> list[str]:
        return ["OUTPUT0"]


class Metrics:
    def __init__(self) -> None:
        self.observed = 0
        self.errors: list[str] = []

    def observe(self, seconds: float) -> None:
        self.observed += 1

    def error(self, code: str) -> None:
        self.errors.append(code)

    def maybe_flush(self) -> None:
        pass


@pytest.fixture
def process(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """hps.triton.model.process imported with the stand-in (and forgotten afterwards)."""
    fake = types.ModuleType(PB_UTILS)
    fake.TritonError = TritonError  # type: ignore[attr-defined]
    fake.InferenceResponse = InferenceResponse  # type: ignore[attr-defined]
    fake.Tensor = Tensor  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, PB_UTILS, fake)
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # it wraps the hook
    sys.modules.pop(PROCESS, None)
    yield importlib.import_module(PROCESS)
    sys.modules.pop(PROCESS, None)


def test_a_cancelled_request_is_answered_cancelled_and_not_computed(process) -> None:
    model = object.__new__(process.ModelProcess)  # only answer() and its metrics are used
    model.metrics = metrics = Metrics()
    model.cancellable = True  # the model has a bounded queue (Triton's dynamic batcher)
    computed: list[Request] = []

    def compute(request: Request) -> np.ndarray:
        computed.append(request)
        return np.zeros((2, 0), np.float32)  # an answer of no floats per row, too

    waiting, given_up = Request(cancelled=False), Request(cancelled=True)
    cancelled, answered = model.answer([given_up, waiting], compute)
    assert computed == [waiting]
    assert cancelled.output_tensors == [] and cancelled.error.code == "CANCELLED"
    assert "cancelled" in cancelled.error.message
    assert metrics.errors == ["CANCELLED"] and metrics.observed == 1
    ((name, out),) = answered.output_tensors
    assert name == "OUTPUT0" and out.shape == (2, 0) and answered.error is None


def test_without_a_bounded_queue_no_request_is_asked_whether_it_was_cancelled(process) -> None:
    """Triton's default scheduler never marks one: no round trip to the server for it."""

    class Unasked(Request):
        def is_cancelled(self) -> bool:
            raise AssertionError("asked")

    model = object.__new__(process.ModelProcess)
    model.metrics, model.cancellable = Metrics(), False
    (answer,) = model.answer([Unasked(cancelled=True)], lambda r: np.ones((1, 4), np.float32))
    assert answer.error is None and model.metrics.observed == 1
