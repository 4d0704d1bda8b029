"""Parsing and validation of the Triton models' inputs, and the error replies."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest

from hps.build import build_session
from hps.cache.xp import array_module, available_xps, to_host
from hps.errors import (
    BackendError,
    BackendUnavailable,
    BatchTooLargeError,
    DTypeError,
    ShapeError,
    UnknownTableError,
)
from hps.triton.model.request import error_reply, lookup_hps_request, parse_ctr_request
from hps.types import ArrayModule
from tests.helpers import make_config

I64, I32 = np.int64, np.int32


@pytest.fixture
def lookup(tmp_path: Path):
    """demo.t0 (dim 4, limit 32 keys) and demo.t1 (dim 8, limit 48) with keys 0..99."""
    session = build_session(make_config(tmp_path), with_cache=False)
    keys = np.arange(100, dtype=I64)
    for name, dim in (("demo.t0", 4), ("demo.t1", 8)):
        values = np.repeat(keys[:, None], dim, axis=1).astype(np.float32) + dim / 100
        session.insert(name, keys, values)
    yield partial(session.lookup_request, "demo")
    session.close()


def test_hugectr_shapes(lookup) -> None:
    keys = np.array([[1, 2, 3, 500]], I64)
    out = lookup_hps_request(keys, np.array([[1, 3]], I32), lookup)
    assert out.shape == (1, 4 + 3 * 8)
    np.testing.assert_allclose(out[0, :4], [1.04] * 4, rtol=1e-6)
    np.testing.assert_allclose(out[0, 4:].reshape(3, 8)[:, 0], [2.08, 3.08, -1.0])


def test_rows_of_a_batch_are_separate_lookups(lookup) -> None:
    keys = np.array([[1, 2], [3, 4]], I64)
    out = lookup_hps_request(keys, np.array([[2, 0], [2, 0]], I32), lookup)
    assert out.shape == (2, 8)
    np.testing.assert_allclose(out[1].reshape(2, 4)[:, 0], [3.04, 4.04])


@pytest.mark.parametrize("xp", available_xps(), ids=lambda xp: xp.__name__)
def test_rows_answered_on_a_gpu_stay_there(lookup, xp: ArrayModule) -> None:
    """A GPU instance's lookup answers each row on its GPU: the request's rows are stacked
    there, not brought to the host (on NumPy here, and on CuPy where a GPU is lent)."""
    on_device = lambda k, c: xp.asarray(lookup(k, c))  # noqa: E731
    keys = np.array([[1, 2], [3, 4]], I64)
    numkeys = np.array([[2, 0], [2, 0]], I32)
    out = lookup_hps_request(keys, numkeys, on_device)
    assert array_module(out) is xp and out.shape == (2, 8)
    np.testing.assert_array_equal(to_host(out), lookup_hps_request(keys, numkeys, lookup))


def test_rows_of_different_output_lengths_are_refused(lookup) -> None:
    keys = np.array([[1, 2], [3, 4]], I64)
    with pytest.raises(ShapeError, match="different lengths"):
        lookup_hps_request(keys, np.array([[2, 0], [0, 2]], I32), lookup)


def test_a_bad_row_refuses_the_request_before_any_row_is_looked_up(lookup) -> None:
    """Every row is checked first: no lookup (and no L1 fill, no counted request) for a
    request that is refused."""
    from hps.validate import RequestLimits

    limits = RequestLimits.of(make_config_tables())
    seen: list[int] = []

    def counting(k: np.ndarray, c: np.ndarray) -> np.ndarray:
        seen.append(int(k.size))
        return lookup(k, c)

    keys = np.array([[1, 2], [3, 4]], I64)
    with pytest.raises(ShapeError, match="add up to 1 but 2"):
        lookup_hps_request(keys, np.array([[1, 1], [1, 0]], I32), counting, limits)
    with pytest.raises(ShapeError, match=r"different lengths \[8, 16\]"):
        lookup_hps_request(keys, np.array([[2, 0], [0, 2]], I32), counting, limits)
    assert seen == []
    out = lookup_hps_request(keys, np.array([[2, 0], [2, 0]], I32), counting, limits)
    assert seen == [2, 2] and out.shape == (2, 8)


def make_config_tables() -> list:
    from hps.types import TableSpec

    return [TableSpec("demo", "t0", 4, max_keys_per_request=32),
            TableSpec("demo", "t1", 8, max_keys_per_request=48)]  # fmt: skip


@pytest.mark.parametrize(
    "keys,numkeys,error,pattern",
    [
        (np.array([[1.0]]), np.array([[1, 0]], I32), DTypeError, "KEYS must be INT64"),
        (np.array([[1]], I32), np.array([[1, 0]], I32), DTypeError, "KEYS must be INT64"),
        (np.array([[1]], I64), np.array([[1, 0]], I64), DTypeError, "NUMKEYS must be INT32"),
        (np.array([1], I64), np.array([[1, 0]], I32), ShapeError, r"KEYS must have shape"),
        (np.array([[1]], I64), np.array([[[1, 0]]], I32), ShapeError, "NUMKEYS must have"),
        (np.array([[1], [2]], I64), np.array([[1, 0]], I32), ShapeError, "batch size 2"),
        (np.array([[1, 2]], I64), np.array([[1, 0]], I32), ShapeError, "add up to 1 but 2"),
        (np.array([[1, 2]], I64), np.array([[3, -1]], I32), ShapeError, "negative key count"),
        (np.array([[1, 2]], I64), np.array([[2]], I32), ShapeError, "1 key counts for 2"),
        (np.zeros((1, 33), I64), np.array([[33, 0]], I32), BatchTooLargeError, "limit of 32"),
    ],
)
def test_bad_requests(lookup, keys, numkeys, error, pattern) -> None:
    with pytest.raises(error, match=pattern):
        lookup_hps_request(keys, numkeys, lookup)


def ctr_inputs(rowindex: list[int], n_keys: int, n_dense: int):
    return (
        np.zeros((1, n_dense), np.float32),
        np.arange(n_keys, dtype=I64)[None],
        np.array([rowindex], I32),
    )


def test_parse_ctr_request() -> None:
    # 2 tables, 3 samples: table 0 has 1 key each, table 1 has 0, 2, 1 keys
    batch = parse_ctr_request(*ctr_inputs([0, 1, 2, 3, 0, 0, 2, 3], 6, 3 * 4), 2, 4)
    assert batch.batch == 3
    assert batch.dense.shape == (3, 4)
    assert batch.num_keys.tolist() == [3, 3]
    assert batch.offsets.tolist() == [[0, 1, 2, 3], [0, 0, 2, 3]]


@pytest.mark.parametrize(
    "rowindex,n_keys,n_dense,pattern",
    [
        ([0, 1, 2, 0, 1], 3, 4, "ROWINDEX has 5 offsets"),
        ([0, 1, 0, 1], 2, 5, "DES has 5 values; expected 1 samples x 4"),
        ([0, 1, 0, 2], 2, 4, "accounts for 3 keys but CATCOLUMN has 2"),
        ([1, 1, 0, 1], 2, 4, "must start at 0"),
        ([0, 2, 1, 0, 1, 1], 2, 8, "never decrease"),
    ],
)
def test_bad_ctr_requests(rowindex, n_keys, n_dense, pattern) -> None:
    with pytest.raises(ShapeError, match=pattern):
        parse_ctr_request(*ctr_inputs(rowindex, n_keys, n_dense), 2, 4)


def test_ctr_dtypes_are_checked() -> None:
    des, cat, row = ctr_inputs([0, 1, 0, 1], 2, 4)
    with pytest.raises(DTypeError, match="DES must be FP32"):
        parse_ctr_request(des.astype(np.float64), cat, row, 2, 4)
    with pytest.raises(DTypeError, match="ROWINDEX must be INT32"):
        parse_ctr_request(des, cat, row.astype(I64), 2, 4)


@pytest.mark.parametrize(
    "exc,code",
    [
        (ShapeError("counts"), "INVALID_ARG"),
        (BatchTooLargeError("big"), "INVALID_ARG"),
        (UnknownTableError("where"), "NOT_FOUND"),
        (BackendUnavailable("down"), "UNAVAILABLE"),
        (BackendError("broken"), "INTERNAL"),
        (ValueError("bug"), "INTERNAL"),
    ],
)
def test_error_reply(exc: Exception, code: str) -> None:
    message, got = error_reply(exc)
    assert got == code
    assert message == f"{type(exc).__name__}: {exc}"
