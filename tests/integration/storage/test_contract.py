"""The contract every L2/L3 backend passes, against real servers and real RocksDB files,
for every row format: what is inserted (stored rows, :mod:`hps.rowformat`) is fetched back
byte for byte, and decodes within the format's bound."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from hps.config import ModelConfig, PersistentDBConfig, VolatileDBConfig
from hps.errors import ConfigError, DTypeError, InvalidValueError, ShapeError, UnknownTableError
from hps.lookup import LookupSession
from hps.rowformat import FORMATS, ROW_DTYPES
from hps.storage import EmbeddingStore, open_store
from hps.storage.multi_process_hash_map import SharedHashMapStore
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


@pytest.fixture(params=ROW_DTYPES)
def spec(store: EmbeddingStore, request: pytest.FixtureRequest) -> TableSpec:
    t = TableSpec(model=unique_name(), table="t", dim=5, row_dtype=request.param)
    store.open_table(t)
    return t


def stored(spec: TableSpec, keys: np.ndarray, seed: int = 0) -> np.ndarray:
    """The stored rows of ``rows(keys)`` in the table's format."""
    return spec.fmt.encode(rows(keys, spec.dim, seed))


def assert_rows(spec: TableSpec, got: np.ndarray, keys: np.ndarray, seed: int = 0) -> None:
    """``got`` are the stored rows of ``rows(keys)``: the same bytes, of the table's dtype
    and width, and decoded within the format's bound of the float32 rows."""
    assert got.dtype == spec.fmt.dtype and got.shape == (keys.size, spec.width)
    np.testing.assert_array_equal(got, stored(spec, keys, seed))
    want = rows(keys, spec.dim, seed)
    decoded = spec.fmt.decode(got, spec.dim)
    if spec.row_dtype == "float32":
        np.testing.assert_array_equal(decoded, want)
    elif spec.row_dtype == "float16":
        np.testing.assert_allclose(decoded, want, rtol=2.0**-11, atol=0)
    else:  # int8: half a step of the row's 255
        bound = (want.max(axis=1) - want.min(axis=1)) / 510 * (1 + 1e-5) + 1e-6
        assert (np.abs(decoded - want) <= bound[:, None]).all()


KEYS = np.array([0, 1, -1, 2**62, -(2**62), 12345678901, 42, 7, 99, 100, 101], dtype=np.int64)


def test_round_trip_in_request_order(store: EmbeddingStore, spec: TableSpec) -> None:
    store.insert(spec.name, KEYS, stored(spec, KEYS))
    query = np.array([42, 555, 0, -1, 2**62, 3], dtype=np.int64)
    values, found = store.fetch(spec.name, query)
    assert found.tolist() == [True, False, True, True, True, False]
    assert values.dtype == spec.fmt.dtype and values.shape == (6, spec.width)
    assert_rows(spec, values[found], query[found])
    assert store.size(spec.name) == KEYS.size


def test_upsert_and_duplicates_keep_the_last(store: EmbeddingStore, spec: TableSpec) -> None:
    store.insert(spec.name, KEYS, stored(spec, KEYS))
    dup = np.array([7, 7, 8], dtype=np.int64)
    vals = np.concatenate(
        [stored(spec, dup[:1], 1), stored(spec, dup[:1], 2), stored(spec, dup[2:])]
    )
    store.insert(spec.name, dup, vals)
    got, found = store.fetch(spec.name, np.array([7, 8]))
    assert found.all()
    np.testing.assert_array_equal(got, vals[1:])
    assert store.size(spec.name) == KEYS.size + 1


def test_insert_absent_keeps_the_rows_held(store: EmbeddingStore, spec: TableSpec) -> None:
    """What a backfill from L3 does: keys held keep their rows, absent keys take the
    batch's (the last of a repeated key), in chunks like any batch."""
    store.insert(spec.name, KEYS, stored(spec, KEYS))
    new = np.arange(5000, 5000 + 2 * CHUNK + 1, dtype=np.int64)
    batch = np.concatenate([KEYS[:3], new, new[:1]])
    values = stored(spec, batch, seed=5)
    values[-1] = stored(spec, new[:1], seed=6)[0]
    store.insert_absent(spec.name, batch, values)
    got, found = store.fetch(spec.name, np.concatenate([KEYS, new]))
    assert found.all()
    assert_rows(spec, got[: KEYS.size], KEYS)
    assert_rows(spec, got[KEYS.size + 1 :], new[1:], seed=5)
    assert_rows(spec, got[KEYS.size : KEYS.size + 1], new[:1], seed=6)
    assert store.size(spec.name) == KEYS.size + new.size
    store.insert_absent(spec.name, KEYS[:0], stored(spec, KEYS[:0]))  # empty: nothing
    assert store.size(spec.name) == KEYS.size + new.size


def _limbs(versions: list[int]) -> np.ndarray:
    """Rows of four float32 16-bit limbs, low first: how the side tables store versions."""
    v = np.array(versions, dtype=np.uint64)
    return (
        (v[:, None] >> (np.arange(4, dtype=np.uint64) * np.uint64(16))) & np.uint64(0xFFFF)
    ).astype(np.float32)


def test_insert_max_keeps_the_greater_row(store: EmbeddingStore) -> None:
    """Rows compare as numbers whose last element is the most significant: a greater row
    replaces, a smaller or equal one does not, an absent key takes it, a key repeated in
    the batch takes its greatest row; in chunks like any batch."""
    side = TableSpec(model=unique_name(), table="t__hps_version", dim=4)
    store.open_table(side)
    held = [5, 2**20, 2**40 + 7, 2**48, 9]
    keys = np.arange(10, 10 + len(held), dtype=np.int64)
    store.insert(side.name, keys, _limbs(held))
    # 5 -> 6 (low limb), 2^20 stays over 2^16 + 2^15 (its low limbs are greater), 2^40 + 7
    # -> 2^41 (high limb), 2^48 stays (equal), 9 stays over 3; absent keys, repeated ones
    new_keys = np.arange(100, 100 + 2 * CHUNK, dtype=np.int64)
    batch = np.concatenate([keys, new_keys, keys[:1], new_keys[:1]])
    versions = [6, 2**16 + 2**15, 2**41, 2**48, 3, *range(1, 2 * CHUNK + 1), 4, 999]
    store.insert_max(side.name, batch, _limbs(versions))
    got, found = store.fetch(side.name, np.concatenate([keys, new_keys]))
    assert found.all()
    want = [6, 2**20, 2**41, 2**48, 9, 999, *range(2, 2 * CHUNK + 1)]
    np.testing.assert_array_equal(got, _limbs(want))
    store.insert_max(side.name, keys[:0], _limbs([])[:0])  # empty: nothing
    assert store.size(side.name) == keys.size + new_keys.size


def test_insert_max_refuses_rows_it_cannot_compare(store: EmbeddingStore, spec: TableSpec) -> None:
    """Only float32 rows of the table's width compare; anything else stores nothing."""
    store.insert(spec.name, KEYS, stored(spec, KEYS))
    good = rows(KEYS, spec.dim, 3)
    bad = [good.astype(np.float64), good[:, :-1], good[:3]]
    if spec.row_dtype != "float32":
        bad.append(good)  # float32 rows of a quantized table
    for values in bad:
        with pytest.raises((DTypeError, ShapeError), match=spec.name):
            store.insert_max(spec.name, KEYS, values)
    got, found = store.fetch(spec.name, KEYS)
    assert found.all()
    assert_rows(spec, got, KEYS)


def test_concurrent_insert_max_keeps_the_greatest(store: EmbeddingStore) -> None:
    """Writers raising the same keys at once (each with its own handle where the store is
    shared) end with every key's greatest row: no raise is lost to a stale read."""
    import threading

    side = TableSpec(model=unique_name(), table="t__hps_watermark", dim=4)
    store.open_table(side)
    keys = np.arange(-8, 0, dtype=np.int64)
    rng = np.random.default_rng(0)
    rounds = [rng.integers(1, 2**40, size=(50, keys.size)).astype(np.uint64) for _ in range(4)]

    def raise_all(versions: np.ndarray) -> None:
        for v in versions:
            store.insert_max(side.name, keys, _limbs(v.tolist()))

    workers = [threading.Thread(target=raise_all, args=(r,)) for r in rounds]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    got, found = store.fetch(side.name, keys)
    assert found.all()
    top = np.max([r.max(axis=0) for r in rounds], axis=0)
    np.testing.assert_array_equal(got, _limbs(top.tolist()))


def test_remove(store: EmbeddingStore, spec: TableSpec) -> None:
    store.insert(spec.name, KEYS, stored(spec, KEYS))
    store.remove(spec.name, np.array([0, 42, 31337], dtype=np.int64))
    _, found = store.fetch(spec.name, KEYS)
    assert found.tolist() == [k not in (0, 42) for k in KEYS.tolist()]
    assert store.size(spec.name) == KEYS.size - 2


def test_tables_are_separate(store: EmbeddingStore, spec: TableSpec) -> None:
    other = TableSpec(model=spec.model, table="u", dim=3, row_dtype=spec.row_dtype)
    store.open_table(other)
    store.insert(spec.name, KEYS, stored(spec, KEYS))
    store.insert(other.name, KEYS[:3], stored(other, KEYS[:3], seed=9))
    got, found = store.fetch(other.name, KEYS)
    assert found.sum() == 3
    assert_rows(other, got[:3], KEYS[:3], seed=9)
    assert store.size(other.name) == 3


def test_large_batches_are_chunked(store: EmbeddingStore, spec: TableSpec) -> None:
    keys = np.arange(1000, 1000 + 20 * CHUNK + 3, dtype=np.int64)
    store.insert(spec.name, keys, stored(spec, keys))
    got, found = store.fetch(spec.name, keys[::-1])
    assert found.all()
    assert_rows(spec, got, keys[::-1])
    store.remove(spec.name, keys[: 10 * CHUNK])
    assert store.size(spec.name) == keys.size - 10 * CHUNK


def test_empty_batches(store: EmbeddingStore, spec: TableSpec) -> None:
    empty = np.empty(0, dtype=np.int64)
    store.insert(spec.name, empty, spec.fmt.empty(0, spec.dim))
    values, found = store.fetch(spec.name, empty)
    assert values.shape == (0, spec.width) and found.shape == (0,)
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
    store.insert(spec.name, KEYS, stored(spec, KEYS))
    model = ModelConfig(
        model=spec.model,
        embedding_table_names=["t"],
        embedding_vecsize_per_table=[spec.dim],
        hps_row_dtype=spec.row_dtype,
    )
    tiers = Tiers(store, None) if store.placement != "disk" else Tiers(None, store)
    session = LookupSession([model], tiers)
    with pytest.raises(error):
        session.insert(spec.name, keys, values)
    got, found = store.fetch(spec.name, KEYS)
    assert found.all()
    assert_rows(spec, got, KEYS)
    assert store.size(spec.name) == KEYS.size


def _other_dtype(spec: TableSpec) -> np.dtype:
    return np.dtype(np.float16 if spec.row_dtype == "float32" else np.float32)


def test_a_batch_of_another_dtype_or_width_is_refused_and_stores_nothing(
    store: EmbeddingStore, spec: TableSpec
) -> None:
    """A store takes only the table's stored rows: float32 rows for an int8 table, rows of
    another width or count are refused before anything is written."""
    store.insert(spec.name, KEYS, stored(spec, KEYS))
    new = np.array([5000, 5001], dtype=np.int64)
    both = np.concatenate([KEYS[:2], new])  # overwrites and new keys
    good = stored(spec, both, seed=3)
    bad = [
        (good.astype(_other_dtype(spec)), DTypeError),
        (rows(both, spec.dim, 3), DTypeError if spec.row_dtype != "float32" else None),
        (np.concatenate([good, good[:, :1]], axis=1), ShapeError),
        (good[:, :-1], ShapeError),
        (good[:3], ShapeError),
        (good.reshape(-1), ShapeError),
    ]
    for values, error in bad:
        if error is None:
            continue  # float32 rows are a float32 table's stored rows
        with pytest.raises(error, match=spec.name):
            store.insert(spec.name, both, values)
        with pytest.raises(error, match=spec.name):
            store.insert_absent(spec.name, both, values)
        if store.versioned_rows:
            with pytest.raises(error, match=spec.name):
                store.insert_versioned(spec.name, both, values, np.ones(4, np.uint64))
    got, found = store.fetch(spec.name, np.concatenate([KEYS, new]))
    assert found.tolist() == [True] * KEYS.size + [False, False]
    assert_rows(spec, got[: KEYS.size], KEYS)
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
    store.insert(spec.name, KEYS, stored(spec, KEYS), durable=True)
    store.remove(spec.name, KEYS[:2], durable=True)
    _, found = store.fetch(spec.name, KEYS)
    assert found.tolist() == [False, False] + [True] * (KEYS.size - 2)


def test_dump_yields_every_row_in_bounded_chunks(store: EmbeddingStore, spec: TableSpec) -> None:
    store.insert(spec.name, KEYS, stored(spec, KEYS))
    chunks = list(store.dump(spec.name, chunk_rows=4))
    keys = np.concatenate([k for k, _ in chunks])
    vectors = np.concatenate([v for _, v in chunks])
    order = np.argsort(keys)
    np.testing.assert_array_equal(keys[order], np.sort(KEYS))
    assert_rows(spec, vectors[order], np.sort(KEYS))
    if store.placement != "server":  # Redis's HSCAN COUNT is a hint, not a bound
        assert max(k.size for k, _ in chunks) <= 4


def test_estimated_size(store: EmbeddingStore, spec: TableSpec) -> None:
    """``size`` everywhere ``exact_size``; else the store's estimate, which counts a fresh
    write (nothing overwritten) and reaches zero for an empty table."""
    assert isinstance(store.exact_size, bool)
    assert store.exact_size == (store.name != "rocks_db")  # a scan only there
    assert store.estimated_size(spec.name) == 0
    store.insert(spec.name, KEYS, stored(spec, KEYS))
    assert store.estimated_size(spec.name) == store.size(spec.name) == KEYS.size


def test_catch_up_and_bytes_per_row(store: EmbeddingStore) -> None:
    store.catch_up()  # a no-op for a read-write handle of every backend
    cls = type(store)
    per_row = cls.bytes_per_row(FORMATS["float32"].row_bytes(64))
    assert 64 * 4 < per_row < 64 * 4 * 3
    assert cls.bytes_per_row(4 * 64, bounded=True) >= per_row
    int8 = cls.bytes_per_row(FORMATS["int8"].row_bytes(64))
    assert FORMATS["int8"].row_bytes(64) < int8 < cls.bytes_per_row(2 * 64) < per_row


# -- row formats recorded where rows persist or are shared ------------------------------------


def _second_handle(store: EmbeddingStore, kind: str, request: pytest.FixtureRequest,
                   tmp_path: Any) -> EmbeddingStore:  # fmt: skip
    """Another handle on the same rows: the same segment, server or (reopened) database."""
    if kind == "rocks_db":
        store.close()
        return _open(kind, request, tmp_path)
    if isinstance(store, SharedHashMapStore):
        cfg = VolatileDBConfig(
            type=kind,
            shared_memory_name=store.path.rsplit("/", 1)[1],
            shared_memory_size=64 * 1024 * 1024,
            max_batch_size=CHUNK,
        )
        again = open_store(cfg)
        assert again is not None
        return again
    return _open(kind, request, tmp_path)


@pytest.mark.parametrize("kind", [b for b in BACKENDS if b != "hash_map"])
def test_a_table_stored_in_another_format_or_dim_is_refused_until_dropped(
    kind: str, request: pytest.FixtureRequest, tmp_path: Any
) -> None:
    first = _open(kind, request, tmp_path)
    spec = TableSpec(model=unique_name(), table="t", dim=8, row_dtype="int8")
    first.open_table(spec)
    first.insert(spec.name, KEYS, stored(spec, KEYS))
    other = _second_handle(first, kind, request, tmp_path)
    try:
        for wrong in (
            TableSpec(model=spec.model, table="t", dim=8, row_dtype="float16"),
            TableSpec(model=spec.model, table="t", dim=8),
            TableSpec(model=spec.model, table="t", dim=9, row_dtype="int8"),
        ):
            with pytest.raises(ConfigError, match=r"holds int8 rows of dimension 8.*--force"):
                other.open_table(wrong)
        other.open_table(spec)  # the same format: the rows are there, byte for byte
        got, found = other.fetch(spec.name, KEYS)
        assert found.all()
        assert_rows(spec, got, KEYS)
        # what `hps import --force` does: drop, then create in the new format
        other.drop_table(spec.name)
        again = TableSpec(model=spec.model, table="t", dim=8, row_dtype="float16")
        other.open_table(again)
        assert other.size(again.name) == 0
        other.insert(again.name, KEYS[:3], stored(again, KEYS[:3]))
        assert_rows(again, other.fetch(again.name, KEYS[:3])[0], KEYS[:3])
        with pytest.raises(ConfigError, match="holds float16 rows"):
            other.open_table(spec)
    finally:
        other.close()
        if kind != "rocks_db":
            first.close()


@pytest.mark.parametrize("kind", [b for b in BACKENDS if b != "hash_map"])
def test_open_tables_declares_each_in_order_and_stops_at_a_refused_one(
    kind: str, request: pytest.FixtureRequest, tmp_path: Any
) -> None:
    first = _open(kind, request, tmp_path)
    model = unique_name()
    held = TableSpec(model=model, table="held", dim=4, row_dtype="int8")
    first.open_table(held)
    first.insert(held.name, KEYS, stored(held, KEYS))
    other = _second_handle(first, kind, request, tmp_path)
    try:
        before = [TableSpec(model=model, table=f"new{i}", dim=4) for i in range(3)]
        after = TableSpec(model=model, table="after", dim=4)
        wrong = TableSpec(model=model, table="held", dim=4, row_dtype="float16")
        with pytest.raises(ConfigError, match="holds int8 rows"):
            other.open_tables([*before, wrong, after])
        for i, spec in enumerate(before):  # declared, and separate
            other.insert(spec.name, KEYS, stored(spec, KEYS, seed=i))
        for i, spec in enumerate(before):
            assert_rows(spec, other.fetch(spec.name, KEYS)[0], KEYS, seed=i)
        with pytest.raises(UnknownTableError):
            other.fetch(after.name, KEYS)
        other.open_tables([held, *before, after])  # again, with what is already open
        assert_rows(held, other.fetch(held.name, KEYS)[0], KEYS)
        assert other.size(after.name) == 0
    finally:
        other.close()
        if kind != "rocks_db":
            first.close()


def test_hash_map_refuses_another_format_in_the_same_process(tmp_path: Any) -> None:
    store = open_store(VolatileDBConfig(type="hash_map"))
    assert store is not None
    spec = TableSpec(model=unique_name(), table="t", dim=4, row_dtype="float16")
    store.open_table(spec)
    with pytest.raises(ConfigError, match="holds float16 rows.*--force"):
        store.open_table(TableSpec(model=spec.model, table="t", dim=4, row_dtype="int8"))
    store.drop_table(spec.name)
    store.open_table(TableSpec(model=spec.model, table="t", dim=4, row_dtype="int8"))
    store.close()
