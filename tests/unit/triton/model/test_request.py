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
from hps.triton.model.request import (
    c_order,
    error_reply,
    lookup_hps_request,
    parse_ctr_request,
    table_major,
)
from hps.types import ArrayModule, TableSpec
from hps.validate import RequestLimits
from tests.helpers import make_config

I64, I32 = np.int64, np.int32


def make_config_tables() -> list[TableSpec]:
    """The tables of make_config's model: t0 (dim 4, 32 keys a request), t1 (dim 8, 48)."""
    return [TableSpec("demo", "t0", 4, max_keys_per_request=32),
            TableSpec("demo", "t1", 8, max_keys_per_request=48)]  # fmt: skip


LIMITS = RequestLimits.of(make_config_tables())


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
    out = lookup_hps_request(keys, np.array([[1, 3]], I32), lookup, LIMITS)
    assert out.shape == (1, 4 + 3 * 8)
    np.testing.assert_allclose(out[0, :4], [1.04] * 4, rtol=1e-6)
    np.testing.assert_allclose(out[0, 4:].reshape(3, 8)[:, 0], [2.08, 3.08, -1.0])


def test_rows_of_a_batch_are_answered_as_separate_lookups(lookup) -> None:
    keys = np.array([[1, 2], [3, 4]], I64)
    out = lookup_hps_request(keys, np.array([[2, 0], [2, 0]], I32), lookup, LIMITS)
    assert out.shape == (2, 8)
    np.testing.assert_allclose(out[1].reshape(2, 4)[:, 0], [3.04, 4.04])


@pytest.mark.parametrize("xp", available_xps(), ids=lambda xp: xp.__name__)
def test_rows_answered_on_a_gpu_stay_there(lookup, xp: ArrayModule) -> None:
    """A GPU instance's lookup answers on its GPU: the request's rows are put in order
    there, not brought to the host (on NumPy here, and on CuPy where a GPU is lent)."""
    on_device = lambda k, c: xp.asarray(lookup(k, c))  # noqa: E731
    keys = np.array([[1, 2], [3, 4]], I64)
    numkeys = np.array([[2, 0], [2, 0]], I32)
    out = lookup_hps_request(keys, numkeys, on_device, LIMITS)
    assert array_module(out) is xp and out.shape == (2, 8)
    np.testing.assert_array_equal(to_host(out), lookup_hps_request(keys, numkeys, lookup, LIMITS))


def test_rows_of_different_output_lengths_are_refused(lookup) -> None:
    keys = np.array([[1, 2], [3, 4]], I64)
    with pytest.raises(ShapeError, match="different lengths"):
        lookup_hps_request(keys, np.array([[2, 0], [0, 2]], I32), lookup, LIMITS)


def test_a_bad_row_refuses_the_request_before_any_row_is_looked_up(lookup) -> None:
    """Every row is checked first: no lookup (and no L1 fill, no counted request) for a
    request that is refused; a good one is one lookup of all its rows' keys."""
    seen: list[list[int]] = []

    def counting(k: np.ndarray, c: np.ndarray) -> np.ndarray:
        seen.append(np.asarray(c).tolist())
        return lookup(k, c)

    keys = np.array([[1, 2], [3, 4]], I64)
    with pytest.raises(ShapeError, match="add up to 1 but 2"):
        lookup_hps_request(keys, np.array([[1, 1], [1, 0]], I32), counting, LIMITS)
    with pytest.raises(ShapeError, match=r"negative key count in \[3, -1\]"):
        lookup_hps_request(keys, np.array([[2, 0], [3, -1]], I32), counting, LIMITS)
    with pytest.raises(ShapeError, match="1 key counts for 2 tables"):
        lookup_hps_request(keys, np.array([[2], [2]], I32), counting, LIMITS)
    with pytest.raises(ShapeError, match=r"demo: the 2 rows .* different lengths \[8, 16\]"):
        lookup_hps_request(keys, np.array([[2, 0], [0, 2]], I32), counting, LIMITS)
    assert seen == []
    out = lookup_hps_request(keys, np.array([[2, 0], [2, 0]], I32), counting, LIMITS)
    assert seen == [[4, 0]] and out.shape == (2, 8)


def test_the_first_bad_row_is_named_as_a_lookup_of_it_alone_would_be(lookup) -> None:
    """Rows are checked all at once, in the order a row-by-row check would refuse them."""
    keys = np.zeros((3, 2), I64)
    numkeys = np.array([[2, 0], [1, 0], [3, -1]], I32)
    with pytest.raises(ShapeError, match="add up to 1 but 2"):
        lookup_hps_request(keys, numkeys, lookup, LIMITS)
    with pytest.raises(ShapeError, match=r"negative key count in \[3, -1\]"):
        lookup_hps_request(keys, numkeys[[0, 2, 1]], lookup, LIMITS)


@pytest.fixture(scope="module")
def three_tables(tmp_path_factory: pytest.TempPathFactory):
    """Model ``m``: tables a, b (dim 4) and c (dim 8) holding keys 0..99, an L1 for each,
    defaults 0.5, -1.0 and 2.0; its lookup and limits."""
    model = {
        "model": "m",
        "embedding_table_names": ["a", "b", "c"],
        "embedding_vecsize_per_table": [4, 4, 8],
        "maxnum_catfeature_query_per_table_per_sample": [8, 8, 8],
        "default_value_for_each_table": [0.5, -1.0, 2.0],
        "max_batch_size": 16,
        "gpucache": True,
        "gpucacheper": 0.5,
    }
    config = make_config(tmp_path_factory.mktemp("three"), models=[model])
    session = build_session(config)
    keys = np.arange(100, dtype=I64)
    for table, dim in (("m.a", 4), ("m.b", 4), ("m.c", 8)):
        session.insert(table, keys, np.random.default_rng(dim).random((100, dim), np.float32))
    yield partial(session.lookup_request, "m"), RequestLimits.of(config.model("m").tables)
    session.close()


@pytest.mark.parametrize("seed", range(8))
def test_rows_of_a_batch_give_what_separate_requests_give(three_tables, seed: int) -> None:
    """B rows in one request, looked up at once, answer exactly what B requests of one row
    answer: random keys (stored ones, missing ones answered by their table's default, and
    duplicates within and across rows), three tables of two dims, rows that split their
    keys differently between the tables of dim 4."""
    lookup, limits = three_tables
    rng = np.random.default_rng(seed)
    batch = int(rng.integers(2, 9))
    a = rng.integers(0, 6, size=batch)  # per row: a + b = 5 keys of dim 4, 2 keys of dim 8
    numkeys = np.stack([a, 5 - a, np.full(batch, 2)], axis=1).astype(I32)
    keys = rng.integers(80, 120, size=(batch, 7), dtype=I64)
    keys[:, 0] = keys[0, 0]  # one key in every row
    out = lookup_hps_request(keys, numkeys, lookup, limits)
    rows = [lookup_hps_request(keys[i : i + 1], numkeys[i : i + 1], lookup, limits)
            for i in range(batch)]  # fmt: skip
    assert out.shape == (batch, 5 * 4 + 2 * 8) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, np.concatenate(rows))


def test_table_major_regroups_the_keys_of_all_rows() -> None:
    """Keys table after table, row after row within a table, and the index that puts the
    answer (in blocks of the tables' common divisor, here 4 floats) back in row order."""
    keys = np.array([[10, 11, 12], [20, 21, 22]], I64)
    numkeys = np.array([[1, 2], [3, 0]], I32)  # widths differ (20, 12): only the order matters
    flat, totals, unit, index = table_major(keys, numkeys, np.array([4, 8], I64))
    assert flat.tolist() == [10, 20, 21, 22, 11, 12] and totals.tolist() == [4, 2]
    assert unit == 4
    # the answer, table-major, in blocks of 4: 10, 20, 21, 22 (one block each), 11, 12 (two)
    answer = np.array([10, 20, 21, 22, 11, 11, 12, 12])
    assert answer[index].tolist() == [10, 11, 11, 12, 12, 20, 21, 22]


def test_rows_without_keys_answer_an_empty_row_each(lookup) -> None:
    """B rows of 0 keys: OUTPUT0 of shape (B, 0), as a [1, 0] request gets [1, 0], with
    strides Triton's stub takes (it refused the (0, 0) strides of np.stack: "DLPack tensor
    is not contiguous")."""
    out = lookup_hps_request(np.zeros((3, 0), I64), np.zeros((3, 2), I32), lookup, LIMITS)
    assert out.shape == (3, 0) and out.dtype == np.float32
    one = lookup_hps_request(np.zeros((1, 0), I64), np.zeros((1, 2), I32), lookup, LIMITS)
    assert one.shape == (1, 0)
    for array in (out, one, np.stack([np.zeros(0, np.float32)] * 3)):
        ready = c_order(array)
        assert ready.shape == array.shape and ready.flags.c_contiguous
        assert ready.strides[-1] == ready.itemsize  # what the stub checks, in elements: 1
    full = np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::2]
    np.testing.assert_array_equal(c_order(full), full)
    assert c_order(full).flags.c_contiguous


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
        lookup_hps_request(keys, numkeys, lookup, LIMITS)


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


@pytest.mark.parametrize("rowindex", [[0, 0], [0], [], [0, 0, 0]])
def test_a_ctr_request_without_samples_is_refused_as_such(rowindex: list[int]) -> None:
    """One offset per table (or fewer) is a request of no sample, which the model cannot
    answer: the error says that one sample is needed, not that the offsets do not add up."""
    with pytest.raises(ShapeError) as err:
        parse_ctr_request(*ctr_inputs(rowindex, 0, 0), 2, 4)
    assert str(err.value) == (
        f"ROWINDEX has {len(rowindex)} offsets, too few for a sample: a CTR request needs "
        "at least one sample, tables (2) x (samples + 1) offsets"
    )


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
