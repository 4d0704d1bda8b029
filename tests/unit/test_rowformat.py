"""Row formats: stored layout and the stated error bounds, over random and adversarial rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from hps.errors import InvalidValueError
from hps.rowformat import FLOAT16_MAX, FLOAT32_MAX, FORMATS, ROW_DTYPES, row_format
from hps.types import TableSpec

F32_EPS = float(np.finfo(np.float32).eps)
F32_TINY = float(np.finfo(np.float32).tiny)  # 2**-126
F16_NORMAL_MIN = float(np.finfo(np.float16).tiny)  # 2**-14

finite32 = st.floats(allow_nan=False, allow_infinity=False, width=32)
# every value float16 holds: its whole normal range and the subnormals below it
float16_range = st.floats(min_value=-FLOAT16_MAX, max_value=FLOAT16_MAX, allow_nan=False, width=32)


def rows_of(elements: st.SearchStrategy[float]) -> st.SearchStrategy[np.ndarray]:
    return st.integers(1, 6).flatmap(
        lambda n: st.integers(1, 40).flatmap(
            lambda d: arrays(np.float32, (n, d), elements=elements)
        )
    )


def int8_bound(x: np.ndarray) -> np.ndarray:
    """Half a step per element, plus the float32 rounding of the decode; a row whose step
    is below float32's normal range is within its range."""
    lo = x.min(axis=1, keepdims=True).astype(np.float64)
    hi = x.max(axis=1, keepdims=True).astype(np.float64)
    big = np.abs(x).max(axis=1, keepdims=True).astype(np.float64)
    bound = (hi - lo) / 510 + 4 * F32_EPS * big
    return np.where(hi - lo < 255 * F32_TINY, np.maximum(bound, hi - lo), bound)


def roundtrip(name: str, x: np.ndarray) -> np.ndarray:
    fmt = row_format(name)
    stored = fmt.encode(x)
    assert stored.dtype == fmt.dtype
    assert stored.shape == (x.shape[0], fmt.width(x.shape[1]))
    assert stored.nbytes == x.shape[0] * fmt.row_bytes(x.shape[1])
    return fmt.decode(stored, x.shape[1])


def test_layouts() -> None:
    assert [FORMATS[n].row_bytes(64) for n in ROW_DTYPES] == [256, 128, 72]
    spec = TableSpec(model="m", table="t", dim=16, row_dtype="int8")
    assert spec.fmt is FORMATS["int8"] and spec.width == 24
    with pytest.raises(ValueError, match="unknown row format 'bf16'"):
        row_format("bf16")


def test_float32_is_stored_as_given() -> None:
    x = np.random.default_rng(0).standard_normal((5, 8), dtype=np.float32)
    stored = FORMATS["float32"].encode(x)
    assert stored is x
    assert FORMATS["float32"].decode(stored, 8) is stored


@settings(max_examples=200, deadline=None)
@given(rows_of(finite32))
def test_int8_within_half_a_step(x: np.ndarray) -> None:
    assume((np.ptp(x.astype(np.float64), axis=1) <= FLOAT32_MAX).all())
    err = np.abs(roundtrip("int8", x).astype(np.float64) - x)
    assert (err <= int8_bound(x)).all()


@settings(max_examples=200, deadline=None)
@given(rows_of(finite32))
def test_int8_serves_a_decoded_row_as_it_was(x: np.ndarray) -> None:
    """An exported int8 table imported again (decode, then encode) serves the values it
    served, however many times it goes round (a row of two values may be stored with
    another of the scales that decode it so)."""
    assume((np.ptp(x.astype(np.float64), axis=1) <= FLOAT32_MAX).all())
    fmt, dim = FORMATS["int8"], x.shape[1]
    served = fmt.decode(fmt.encode(x), dim)
    assert np.array_equal(fmt.decode(fmt.encode(served), dim), served)


def test_int8_stores_decoded_rows_as_they_were() -> None:
    """Byte for byte, where the codes pin the scale: of these rows, a re-encode from the
    decoded maximum alone changed the scale of 5 % by an ulp or two."""
    fmt = FORMATS["int8"]
    x = (np.random.default_rng(0).standard_normal((20_000, 16)) * 4).astype(np.float32)
    stored = fmt.encode(x)
    assert np.array_equal(fmt.encode(fmt.decode(stored, 16)), stored)


@settings(max_examples=200, deadline=None)
@given(rows_of(float16_range))
def test_float16_within_its_rounding(x: np.ndarray) -> None:
    y = roundtrip("float16", x).astype(np.float64)
    normal = np.abs(x) >= F16_NORMAL_MIN
    rel = np.abs(y - x)[normal] / np.abs(x.astype(np.float64))[normal]
    assert (rel <= 2.0**-11).all()
    # below the normal range, float16 keeps an absolute step of 2**-24
    assert (np.abs(y - x)[~normal] <= 2.0**-25).all()


@pytest.mark.parametrize(
    "row",
    [
        np.full(16, 0.1, dtype=np.float32),  # constant: stored exactly (scale 0)
        np.full(16, -3.4e38, dtype=np.float32),  # constant at the edge of float32
        np.array([0.0] * 15 + [1e6], dtype=np.float32),  # one huge outlier
        np.array([-1.7e38, 1.7e38] * 8, dtype=np.float32),  # a range at float32's edge
        np.array([-0.0, 0.0] * 8, dtype=np.float32),  # negative zero
        np.array([1.0, np.nextafter(np.float32(1), np.float32(2))] * 8, dtype=np.float32),
    ],
)
def test_int8_adversarial_rows(row: np.ndarray) -> None:
    x = row[None, :]
    y = roundtrip("int8", x)
    assert np.isfinite(y).all()
    assert (np.abs(y.astype(np.float64) - x) <= int8_bound(x)).all()
    if np.ptp(row) == 0:
        assert np.array_equal(y, x)


def test_int8_refuses_rows_wider_than_float32() -> None:
    x = np.array([[-3.4e38, 3.4e38]], dtype=np.float32)
    with pytest.raises(InvalidValueError, match="span more than float32's range"):
        FORMATS["int8"].encode(x)


def test_float16_negative_zero_and_limits() -> None:
    x = np.array([[-0.0, 0.0, FLOAT16_MAX, -FLOAT16_MAX]], dtype=np.float32)
    y = roundtrip("float16", x)
    assert np.array_equal(y, x) and np.signbit(y[0, 0])


@pytest.mark.parametrize("value", [65520.0, -1e5, 3e38])
def test_float16_refuses_out_of_range(value: float) -> None:
    x = np.array([[1.0, value]], dtype=np.float32)
    with pytest.raises(InvalidValueError, match="outside float16's range"):
        FORMATS["float16"].encode(x)


def test_int8_empty_batch() -> None:
    stored = FORMATS["int8"].encode(np.empty((0, 4), dtype=np.float32))
    assert stored.shape == (0, 12)
    assert FORMATS["int8"].decode(stored, 4).shape == (0, 4)
