"""The inference client's helpers: random CTR inputs, Triton's errors as hps errors."""

from __future__ import annotations

import numpy as np
import pytest

from hps.errors import BackendUnavailable, RequestError, UnknownTableError
from hps.triton.client import ctr_request, translate


def test_ctr_request_shapes() -> None:
    dense, keys, rowindex = ctr_request(4, 13, [10, 20, 30], np.random.default_rng(0))
    assert dense.shape == (4 * 13,) and keys.shape == (12,)
    assert rowindex.tolist() == [0, 1, 2, 3, 4] * 3
    assert (keys[:4] < 10).all() and (keys[8:] < 30).all()


class FakeError(Exception):
    def __init__(self, msg: str, status: str | None) -> None:
        super().__init__(msg)
        self._msg, self._status = msg, status

    def message(self) -> str:
        return self._msg

    def status(self) -> str | None:
        return self._status


@pytest.mark.parametrize(
    "msg,status,kind",
    [
        ("ShapeError: counts", "400", RequestError),
        ("Request for unknown model: 'x' is not found", "400", UnknownTableError),
        ("down", "StatusCode.UNAVAILABLE", BackendUnavailable),
        ("gone", "StatusCode.NOT_FOUND", UnknownTableError),
    ],
)
def test_translate_client_errors(msg: str, status: str, kind: type) -> None:
    err = translate(FakeError(msg, status))
    assert type(err) is kind and str(err) == msg
