"""The contract every L2/L3 backend passes, against real servers and real RocksDB files."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from hps.config import ModelConfig, PersistentDBConfig, VolatileDBConfig
from hps.errors import DTypeError, InvalidValueError, ShapeError, UnknownTableError
from hps.lookup import LookupSession
from hps.storage import EmbeddingStore, open_store
from hps.tiers import Tiers
from hps.types import TableSpec
from tests.helpers import rows, unique_name

pytestmark = pytest.mark.integration

BACKENDS = ["hash_map", "multi_process_hash_map", "rocks_db", "redis", "redis_cluster"]
CHUNK = 7  # a max_batch_size small enough that every batch below is chunked


def _open(kind: str, request: pytest.FixtureRequest, tmp_path: Any) -> EmbeddingStore:
    if kind == "hash_map":
        store = open_store(VolatileDBConfig(type="hash_map", max_batch_size=CHUNK))
    elif kind == "multi_process_hash_map":
        cfg = VolatileDBConfig(
            type=kind,
            shared_memory_name=unique_name("hps_contract"),
            shared_memory_size=64 * 1024 * 1024,
            max_batch_size=CHUNK,
        )
        store = open_store(cfg)
    elif kind == "rocks_db":
        cfg = PersistentDBConfig(type="rocks_db", path=str(tmp_path / "db"), max_batch_size=CHUNK)
        store = open_store(cfg)
    else:
        server = request.getfixturevalue("redis_server" if kind == "redis" else "redis_cluster")
        cfg = VolatileDBConfig(
            type="redis_cluster", address=server.address, max_batch_size=CHUNK, num_partitions=4
        )
        store = open_store(cfg)
    assert store is not None
    return store


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[EmbeddingStore]:
    s = _open(request.param, request, tmp_path)
    yield s
    s.close()


@pytest.fixture
def spec(store: EmbeddingStore) -> TableSpec:
    t = TableSpec(model=unique_name(), table="t", dim=5)
    store.open_table(t)
    return t


KEYS = np.array([0, 1, -1, 2**62, -(2**62), 12345678901, 42, 7, 99, 100, 101], dtype=np.int64)


def test_round_trip_in_request_order(store: EmbeddingStore, spec: TableSpec) -> None:
    store.insert(spec.name, KEYS, rows(KEYS, spec.dim))
    query = np.array([42, 555, 0, -1, 2**62, 3], dtype=np.int64)
    values, found = store.fetch(spec.name, query)
    assert found.tolist() == [True, False, True, True, True, False]
    np.testing.assert_array_equal(values[found], rows(query[found], spec.dim))
    assert values.dtype == np.float32 and values.shape == (6, spec.dim)
    assert store.size(spec.name) == KEYS.size


def test_upsert_and_duplicates_keep_the_last(store: EmbeddingStore, spec: TableSpec) -> None:
    store.insert(spec.name, KEYS, rows(KEYS, spec.dim))
    dup = np.array([7, 7, 8], dtype=np.int64)
    vals = np.stack(
        [rows(dup[:1], spec.dim, 1)[0], rows(dup[:1], spec.dim, 2)[0], rows(dup[2:], spec.dim)[0]]
    )
    store.insert(spec.name, dup, vals)
    got, found = store.fetch(spec.name, np.array([7, 8]))
    assert found.all()
    np.testing.assert_array_equal(got, vals[1:])
    assert store.size(spec.name) == KEYS.size + 1


def test_remove(store: EmbeddingStore, spec: TableSpec) -> None:
    store.insert(spec.name, KEYS, rows(KEYS, spec.dim))
    store.remove(spec.name, np.array([0, 42, 31337], dtype=np.int64))
    _, found = store.fetch(spec.name, KEYS)
    assert found.tolist() == [k not in (0, 42) for k in KEYS.tolist()]
    assert store.size(spec.name) == KEYS.size - 2


def test_tables_are_separate(store: EmbeddingStore, spec: TableSpec) -> None:
    other = TableSpec(model=spec.model, table="u", dim=3)
    store.open_table(other)
    store.insert(spec.name, KEYS, rows(KEYS, spec.dim))
    store.insert(other.name, KEYS[:3], rows(KEYS[:3], 3, seed=9))
    got, found = store.fetch(other.name, KEYS)
    assert found.sum() == 3
    np.testing.assert_array_equal(got[:3], rows(KEYS[:3], 3, seed=9))
    assert store.size(other.name) == 3


def test_large_batches_are_chunked(store: EmbeddingStore, spec: TableSpec) -> None:
    keys = np.arange(1000, 1000 + 20 * CHUNK + 3, dtype=np.int64)
    store.insert(spec.name, keys, rows(keys, spec.dim))
    got, found = store.fetch(spec.name, keys[::-1])
    assert found.all()
    np.testing.assert_array_equal(got, rows(keys[::-1], spec.dim))
    store.remove(spec.name, keys[: 10 * CHUNK])
    assert store.size(spec.name) == keys.size - 10 * CHUNK


def test_empty_batches(store: EmbeddingStore, spec: TableSpec) -> None:
    empty = np.empty(0, dtype=np.int64)
    store.insert(spec.name, empty, np.empty((0, spec.dim), dtype=np.float32))
    values, found = store.fetch(spec.name, empty)
    assert values.shape == (0, spec.dim) and found.shape == (0,)
    store.remove(spec.name, empty)
    assert store.size(spec.name) == 0


@pytest.mark.parametrize(
    ("keys", "values", "error"),
    [
        (np.array([1.5, 2.0]), np.zeros((2, 5), np.float32), DTypeError),
        (np.array([1, 2]), np.zeros((2, 4), np.float32), ShapeError),
        (np.array([1, 2, 3]), np.zeros((2, 5), np.float32), ShapeError),
        (np.array([1, 2]), np.array([[0, 0, 0, 0, np.nan]] * 2, np.float32), InvalidValueError),
        (np.array([1, 2]), np.ones((2, 5), np.int32), DTypeError),
    ],
)
def test_bad_inserts_change_nothing(
    store: EmbeddingStore, spec: TableSpec, keys: Any, values: Any, error: type
) -> None:
    """Bad batches are refused at the boundary (the session), before any store sees them."""
    store.insert(spec.name, KEYS, rows(KEYS, spec.dim))
    model = ModelConfig(
        model=spec.model, embedding_table_names=["t"], embedding_vecsize_per_table=[spec.dim]
    )
    tiers = Tiers(store, None) if store.placement != "disk" else Tiers(None, store)
    session = LookupSession([model], tiers)
    with pytest.raises(error):
        session.insert(spec.name, keys, values)
    got, found = store.fetch(spec.name, KEYS)
    assert found.all()
    np.testing.assert_array_equal(got, rows(KEYS, spec.dim))
    assert store.size(spec.name) == KEYS.size


def test_unknown_table(store: EmbeddingStore) -> None:
    with pytest.raises(UnknownTableError, match="nope.t"):
        store.fetch("nope.t", np.array([1], dtype=np.int64))


# -- declared capabilities (hps/storage/base.py) ---------------------------------------------


def test_placement_and_write_access(store: EmbeddingStore) -> None:
    assert store.placement in ("process", "node", "server", "disk")
    assert store.writable  # opened read_write
    assert isinstance(store.durable, bool)
    assert store.durable == (store.placement == "disk")


def test_durable_writes_and_removes_are_accepted(store: EmbeddingStore, spec: TableSpec) -> None:
    store.insert(spec.name, KEYS, rows(KEYS, spec.dim), durable=True)
    store.remove(spec.name, KEYS[:2], durable=True)
    _, found = store.fetch(spec.name, KEYS)
    assert found.tolist() == [False, False] + [True] * (KEYS.size - 2)


def test_dump_yields_every_row_in_bounded_chunks(store: EmbeddingStore, spec: TableSpec) -> None:
    store.insert(spec.name, KEYS, rows(KEYS, spec.dim))
    chunks = list(store.dump(spec.name, chunk_rows=4))
    keys = np.concatenate([k for k, _ in chunks])
    vectors = np.concatenate([v for _, v in chunks])
    order = np.argsort(keys)
    np.testing.assert_array_equal(keys[order], np.sort(KEYS))
    np.testing.assert_array_equal(vectors[order], rows(np.sort(KEYS), spec.dim))
    if store.placement != "server":  # Redis's HSCAN COUNT is a hint, not a bound
        assert max(k.size for k, _ in chunks) <= 4


def test_estimated_size(store: EmbeddingStore, spec: TableSpec) -> None:
    """``size`` everywhere ``exact_size``; else the store's estimate, which counts a fresh
    write (nothing overwritten) and reaches zero for an empty table."""
    assert isinstance(store.exact_size, bool)
    assert store.exact_size == (store.name != "rocks_db")  # a scan only there
    assert store.estimated_size(spec.name) == 0
    store.insert(spec.name, KEYS, rows(KEYS, spec.dim))
    assert store.estimated_size(spec.name) == store.size(spec.name) == KEYS.size


def test_catch_up_and_bytes_per_row(store: EmbeddingStore) -> None:
    store.catch_up()  # a no-op for a read-write handle of every backend
    per_row = type(store).bytes_per_row(64)
    assert 64 * 4 < per_row < 64 * 4 * 3
    assert type(store).bytes_per_row(64, bounded=True) >= per_row
