"""Every backend's dump (export, the L2 fill from L3, key scans) yields chunks of bounded
bytes by default (hps.io.chunks), whatever the rows' width, and every row once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import rocksdict as rd

from hps.io import chunks
from hps.rowformat import ROW_DTYPES, RowDtype
from hps.storage import rocks_rows
from hps.storage.base import EmbeddingStore
from hps.storage.hash_map import HashMapStore
from hps.storage.multi_process_hash_map import SharedHashMapStore
from hps.storage.rocks_db import RocksDBStore
from hps.tiers import Tiers
from hps.types import TableSpec
from tests.helpers import rows, unique_name

DIM = 1024
BUDGET = 64 << 10  # 16 float32 rows of dim 1024, 32 float16, 63 int8 (1032 bytes)
KEYS = np.arange(200, dtype=np.int64)


@pytest.fixture(params=["hash_map", "rocks_db", "multi_process_hash_map"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EmbeddingStore]:
    s: EmbeddingStore
    if request.param == "hash_map":
        s = HashMapStore()
    elif request.param == "rocks_db":
        s = RocksDBStore(str(tmp_path / "db"))
    else:
        name = unique_name("hps_test_dump")
        s = SharedHashMapStore(name, 64 << 20)
    yield s
    s.close()
    if request.param == "multi_process_hash_map":
        for suffix in ("", ".lock", ".users", ".turn"):
            if os.path.exists(f"/dev/shm/{name}{suffix}"):
                os.unlink(f"/dev/shm/{name}{suffix}")


@pytest.mark.parametrize("row_dtype", ROW_DTYPES)
def test_a_wide_table_dumps_in_chunks_of_bounded_bytes(
    store: EmbeddingStore, monkeypatch: pytest.MonkeyPatch, row_dtype: RowDtype
) -> None:
    monkeypatch.setattr(chunks, "CHUNK_BYTES", BUDGET)
    spec = TableSpec("m", "t", DIM, row_dtype=row_dtype)
    store.open_table(spec)
    stored = spec.fmt.encode(rows(KEYS, DIM))
    store.insert(spec.name, KEYS, stored)
    per_chunk = BUDGET // spec.fmt.row_bytes(DIM)
    got = list(store.dump(spec.name))
    assert max(k.size for k, _ in got) == per_chunk
    assert len(got) == -(-KEYS.size // per_chunk)
    keys = np.concatenate([k for k, _ in got])
    values = np.concatenate([v for _, v in got])
    order = np.argsort(keys)
    assert np.array_equal(keys[order], KEYS)
    assert values.dtype == spec.fmt.dtype and np.array_equal(values[order], stored)
    # an explicit chunk size is still taken as given
    assert max(k.size for k, _ in store.dump(spec.name, 50)) == 50


def test_the_l2_fill_from_l3_inserts_bounded_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunks, "CHUNK_BYTES", BUDGET)
    spec = TableSpec("m", "t", DIM)
    tiers = Tiers(HashMapStore(), RocksDBStore(str(tmp_path / "db")))
    tiers.open_tables([spec])
    assert tiers.persistent is not None and tiers.volatile is not None
    tiers.persistent.insert(spec.name, KEYS, rows(KEYS, DIM))
    inserted: list[int] = []
    insert = tiers.volatile.insert

    def spy(table: str, keys: np.ndarray, values: np.ndarray, *, durable: bool = False) -> None:
        inserted.append(keys.size)
        insert(table, keys, values)

    monkeypatch.setattr(tiers.volatile, "insert", spy)
    assert tiers.fill_l2_from_l3(spec.name) == KEYS.size
    assert max(inserted) == 16 and sum(inserted) == KEYS.size
    tiers.close()


def test_a_rocks_dump_reads_rows_of_both_value_formats_in_one_chunk(tmp_path: Path) -> None:
    """Format 2 (row + version) is copied out of the joined bytes at once; a chunk that
    holds format-1 rows (float32 alone) too is decoded row by row, as before."""
    spec = TableSpec("m", "t", 3)
    store = RocksDBStore(str(tmp_path / "db"))
    store.open_table(spec)
    store.insert(spec.name, KEYS[:4], rows(KEYS[:4], 3))
    store.close()
    raw = rd.Options(raw_mode=True)
    db = rd.Rdict(str(tmp_path / "db"), column_families={spec.name: raw}, options=raw)
    format_1 = rows(KEYS[1:2], 3, seed=5).tobytes()  # the float32 row alone, no version
    db.get_column_family(spec.name)[int(KEYS[1]).to_bytes(8, "little")] = format_1
    db.close()
    store = RocksDBStore(str(tmp_path / "db"))
    store.open_table(spec)
    ((keys, values),) = list(store.dump(spec.name))
    want = rows(KEYS[:4], 3)
    want[1] = rows(KEYS[1:2], 3, seed=5)
    assert keys.tolist() == KEYS[:4].tolist() and np.array_equal(values, want)
    vals = rocks_rows.encode(want, None)
    k, v = rocks_rows.decode_items([int(x).to_bytes(8, "little") for x in keys], vals, spec.fmt, 3)
    assert np.array_equal(v, want) and v.flags.c_contiguous and v.dtype == np.float32
    store.close()
