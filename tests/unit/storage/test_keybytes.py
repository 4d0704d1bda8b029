"""Keys as stored bytes, written in the order RocksDB keeps them in."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hps.storage.rocks_db import RocksDBStore
from hps.types import TableSpec

SPEC = TableSpec("m", "t", 2)


def test_the_last_row_of_a_key_in_one_write_wins(tmp_path: Path) -> None:
    store = RocksDBStore(str(tmp_path / "db"), max_batch_size=3)
    store.open_table(SPEC)
    keys = np.array([7, 2**40, 7, 5, 7], np.int64)
    rows = np.arange(10, dtype=np.float32).reshape(5, 2)
    store.insert_versioned(SPEC.name, keys, rows, np.array([1, 2, 3, 4, 5], np.uint64))
    values, found = store.fetch(SPEC.name, np.array([7, 2**40, 5], np.int64))
    assert found.all()
    np.testing.assert_array_equal(values, rows[[4, 1, 3]])
    versions, _ = store.fetch_versions(SPEC.name, np.array([7], np.int64))
    assert versions.tolist() == [5]
    store.close()
