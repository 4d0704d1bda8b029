"""The answer checks of load-test lookups, over tables of different dimensions."""

from __future__ import annotations

import numpy as np
import pytest

from hps.loadtest.requests import LookupRequest, WrongAnswer, check_refused


def _request() -> tuple[LookupRequest, np.ndarray]:
    """Table 0: 3 keys of dim 2; table 1: 4 keys of dim 3; known keys planted in both."""
    answer = np.arange(3 * 2 + 4 * 3, dtype=np.float32)
    t0, t1 = answer[:6].reshape(3, 2), answer[6:].reshape(4, 3)
    checks = [(np.array([2, 0]), t0[[2, 0]]), (np.array([3, 1]), t1[[3, 1]])]
    req = LookupRequest(np.zeros(7, np.int64), np.array([3, 4]), [2, 3], checks)
    return req, answer


def test_the_right_vectors_pass() -> None:
    req, answer = _request()
    req.check(answer)
    req.checks = [(np.zeros(0, np.int64), np.zeros((0, d), np.float32)) for d in (2, 3)]
    req.check(answer)  # nothing planted: only the size is checked


@pytest.mark.parametrize(
    ("spoiled", "message"),
    [([6 + 3 * 3 + 2], "table 1: 1/2 known"), ([4, 6 + 3, 6 + 9], "table 0: 1/2 known")],
)
def test_a_wrong_value_names_the_first_table_that_got_one(spoiled: list[int], message: str) -> None:
    req, answer = _request()
    answer[spoiled] += 1.0
    with pytest.raises(WrongAnswer, match=message):
        req.check(answer)


def test_an_unplanted_row_is_not_checked() -> None:
    req, answer = _request()
    answer[6 + 0] += 1.0  # table 1's row 0 holds no known key
    req.check(answer)


@pytest.mark.parametrize("status", ["StatusCode.INVALID_ARGUMENT", "400"])
def test_a_client_error_is_a_refusal(status: str) -> None:
    check_refused("negative count", status, "bad NUMKEYS")


@pytest.mark.parametrize(
    "status",
    ["StatusCode.INTERNAL", "500", "StatusCode.UNKNOWN", "StatusCode.DEADLINE_EXCEEDED",
     "StatusCode.RESOURCE_EXHAUSTED", "StatusCode.UNAVAILABLE", "StatusCode.NOT_FOUND", ""],
)  # fmt: skip
def test_a_server_error_is_no_refusal_of_a_malformed_request(status: str) -> None:
    with pytest.raises(WrongAnswer, match="negative count: refused with .*, not as a malformed"):
        check_refused("negative count", status, "stub crashed")
