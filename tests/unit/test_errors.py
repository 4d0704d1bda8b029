"""The one mapping from core errors to statuses, shared by Triton and the control plane."""

from __future__ import annotations

import pytest

from hps.errors import (
    BackendError,
    BackendUnavailable,
    BatchTooLargeError,
    CircuitOpenError,
    ConfigError,
    DecodeError,
    DTypeError,
    FormatError,
    ShapeError,
    UnknownTableError,
    http_status,
    triton_code,
)


@pytest.mark.parametrize(
    ("exc", "http", "triton"),
    [
        (ShapeError("counts"), 400, "INVALID_ARG"),
        (DTypeError("dtype"), 400, "INVALID_ARG"),
        (BatchTooLargeError("big"), 413, "INVALID_ARG"),
        (UnknownTableError("where"), 404, "NOT_FOUND"),
        (FormatError("bad file"), 422, "INTERNAL"),
        (DecodeError("bad message"), 422, "INTERNAL"),
        (BackendError("broken"), 502, "INTERNAL"),
        (BackendUnavailable("down"), 503, "UNAVAILABLE"),
        (CircuitOpenError("skipped"), 503, "UNAVAILABLE"),
        (ConfigError("ps.json"), 500, "INTERNAL"),
        (ValueError("a bug"), 500, "INTERNAL"),
    ],
)
def test_each_error_has_one_http_status_and_one_triton_code(
    exc: Exception, http: int, triton: str
) -> None:
    assert (http_status(exc), triton_code(exc)) == (http, triton)
