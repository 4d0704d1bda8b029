"""Request limits over all rows, CTR sample limits and finite dense features; fuzzing."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from hps.build import build_session
from hps.errors import BatchTooLargeError, InvalidValueError, RequestError, ShapeError
from hps.triton.model.request import RequestLimits, lookup_hps_request, parse_ctr_request
from tests.helpers import make_config

I64, I32 = np.int64, np.int32


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    """demo.t0 (dim 4, limit 32 keys per request) and demo.t1 (dim 8, limit 48)."""
    config = make_config(tmp_path_factory.mktemp("limits"))
    session = build_session(config, with_cache=False)
    yield partial(session.lookup_request, "demo"), RequestLimits.of(config.model("demo").tables)
    session.close()


def test_keys_of_all_rows_count_against_the_limit(model) -> None:
    lookup, limits = model
    keys = np.zeros((2, 20), I64)  # 20 keys per row of t0: under 32, but 40 in all
    with pytest.raises(BatchTooLargeError, match=r"demo.t0: 40 keys over the 2 rows .* of 32"):
        lookup_hps_request(keys, np.array([[20, 0], [20, 0]], I32), lookup, limits)
    out = lookup_hps_request(keys[:, :16], np.array([[16, 0], [16, 0]], I32), lookup, limits)
    assert out.shape == (2, 16 * 4)


def test_a_huge_row_is_refused_before_its_counts_are_read(model) -> None:
    _, limits = model
    with pytest.raises(BatchTooLargeError, match="1,000,000 keys per row exceed the 80"):
        limits.check(np.zeros((1, 1_000_000), I64), np.array([[1, 0]], I32))
    limits.check(np.zeros((1, 3), I64), np.array([[3]], I32))  # width: left to lookup


def test_an_empty_batch_is_refused(model) -> None:
    lookup, limits = model
    with pytest.raises(ShapeError, match="batch size 0"):
        lookup_hps_request(np.zeros((0, 3), I64), np.zeros((0, 2), I32), lookup, limits)


def ctr(samples: int, dense: np.ndarray | None = None):
    des = np.zeros((1, samples * 2), np.float32) if dense is None else dense
    return des, np.zeros((1, samples), I64), np.arange(samples + 1, dtype=I32)[None]


def test_ctr_samples_are_bounded_by_max_batch_size() -> None:
    assert parse_ctr_request(*ctr(16), 1, 2, max_samples=16).batch == 16
    with pytest.raises(BatchTooLargeError, match="17 samples exceed the model's max_batch_size"):
        parse_ctr_request(*ctr(17), 1, 2, max_samples=16)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_ctr_dense_features_must_be_finite(bad: float) -> None:
    dense = np.zeros((1, 6), np.float32)
    dense[0, 3] = bad
    with pytest.raises(InvalidValueError, match="1 NaN or infinite values .* sample 1"):
        parse_ctr_request(*ctr(3, dense), 1, 2)


DTYPES = st.sampled_from([np.int64, np.int32, np.float32, np.float64, np.uint8])


def arrays(max_side: int = 6) -> st.SearchStrategy[np.ndarray]:
    return DTYPES.flatmap(
        lambda dt: hnp.arrays(
            dt, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=max_side)
        )
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=arrays(), numkeys=arrays())
def test_fuzz_hps_request(model, keys: np.ndarray, numkeys: np.ndarray) -> None:
    """Any inputs: an answer of the documented shape, or a RequestError, nothing else."""
    lookup, limits = model
    try:
        out = lookup_hps_request(keys, numkeys, lookup, limits)
    except RequestError:
        return
    assert out.dtype == np.float32 and out.shape[0] == keys.shape[0]


@settings(max_examples=150, deadline=None)
@given(
    des=arrays(),
    cat=arrays(),
    row=arrays(),
    tables=st.integers(1, 3),
    dense=st.integers(0, 3),
)
def test_fuzz_ctr_request(des, cat, row, tables: int, dense: int) -> None:
    try:
        batch = parse_ctr_request(des, cat, row, tables, dense, max_samples=4)
    except RequestError:
        return
    assert 1 <= batch.batch <= 4 and batch.dense.shape == (batch.batch, dense)
    assert np.isfinite(batch.dense).all() and int(batch.num_keys.sum()) == batch.keys.size


@settings(max_examples=100, deadline=None)
@given(
    numkeys=hnp.arrays(I32, st.tuples(st.integers(1, 4), st.just(2)), elements=st.integers(-5, 40))
)
def test_fuzz_valid_shapes_with_counts(model, numkeys: np.ndarray) -> None:
    """Well-typed requests with arbitrary counts: limits hold or a RequestError is raised."""
    lookup, limits = model
    n = int(np.clip(numkeys, 0, None).sum(axis=1).max())
    keys = np.arange(numkeys.shape[0] * n, dtype=I64).reshape(numkeys.shape[0], n)
    try:
        out = lookup_hps_request(keys, numkeys, lookup, limits)
    except RequestError:
        return
    assert (numkeys >= 0).all() and (numkeys.sum(axis=0) <= [32, 48]).all()
    assert out.shape[0] == numkeys.shape[0]
