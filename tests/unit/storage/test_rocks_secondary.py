"""A secondary rocks_db instance catches up only when its writer wrote something, and then
sees every write: rows in the WAL, rows flushed to SST files, a reopened writer's new WAL."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from hps.storage.rocks_db import RocksDBStore
from hps.storage.rocks_open import INFO_LOGS_KEPT
from hps.types import TableSpec

SPEC = TableSpec("m", "t", 4)


def rows(keys: list[int], seed: float) -> np.ndarray:
    return np.array([[k + seed] * 4 for k in keys], dtype=np.float32)


def found(store: RocksDBStore, keys: list[int]) -> list[bool]:
    return store.fetch(SPEC.name, np.array(keys, np.int64))[1].tolist()


def test_a_catch_up_runs_only_after_a_write(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    writer = RocksDBStore(path)
    writer.open_table(SPEC)
    writer.insert(SPEC.name, np.array([1], np.int64), rows([1], 0.5), durable=True)
    reader = RocksDBStore(path, mode="secondary")
    reader.open_table(SPEC)
    reader.catch_up()
    reader.catch_up()
    assert reader.catch_ups == 1  # nothing written in between: skipped
    assert found(reader, [1, 2]) == [True, False]

    writer.insert(SPEC.name, np.array([2], np.int64), rows([2], 0.5))  # WAL only
    reader.catch_up()
    assert reader.catch_ups == 2 and found(reader, [2]) == [True]
    np.testing.assert_array_equal(reader.fetch(SPEC.name, np.array([2]))[0], rows([2], 0.5))

    writer._db.flush()  # rows move to an SST file: a MANIFEST write, a new WAL
    writer.remove(SPEC.name, np.array([1], np.int64))
    reader.catch_up()
    assert reader.catch_ups == 3 and found(reader, [1, 2]) == [False, True]
    reader.catch_up()
    assert reader.catch_ups == 3

    writer.close()  # a reopened writer starts a new WAL and MANIFEST
    writer = RocksDBStore(path)
    writer.open_table(SPEC)
    writer.insert(SPEC.name, np.array([3], np.int64), rows([3], 0.5))
    reader.catch_up()
    assert reader.catch_ups == 4 and found(reader, [1, 2, 3]) == [False, True, True]
    reader.close()
    writer.close()


def test_a_secondary_catches_up_past_the_drop_of_a_table_it_never_saw(tmp_path: Path) -> None:
    """RocksDB's secondary cannot replay the drop of a column family created after it
    opened (a model version imported, then retired): the store opens itself again."""
    path = str(tmp_path / "db")
    writer = RocksDBStore(path)
    writer.open_table(SPEC)
    reader = RocksDBStore(path, mode="secondary")
    reader.open_table(SPEC)
    later = TableSpec("m", "t", 4, version=2)
    writer.open_table(later)
    writer.insert(later.name, np.array([5], np.int64), rows([5], 0.5), durable=True)
    writer.drop_table(later.name)
    writer.insert(SPEC.name, np.array([3], np.int64), rows([3], 0.5), durable=True)
    before = reader._opened
    reader.catch_up()
    assert reader.reopens == 1 and found(reader, [3]) == [True]
    assert before.secondary_dir is not None and not Path(before.secondary_dir).exists()
    writer.insert(SPEC.name, np.array([4], np.int64), rows([4], 0.5))
    reader.catch_up()  # the reopened one follows as before
    assert reader.reopens == 1 and found(reader, [3, 4]) == [True, True]
    reader.close()
    writer.close()
    assert reader._opened.secondary_dir is not None
    assert not Path(reader._opened.secondary_dir).exists()


def test_a_writer_store_never_catches_up(tmp_path: Path) -> None:
    writer = RocksDBStore(str(tmp_path / "db"))
    writer.catch_up()
    assert writer.catch_ups == 0
    writer.close()


def test_old_info_logs_are_pruned(tmp_path: Path) -> None:
    path = tmp_path / "db"
    for _ in range(INFO_LOGS_KEPT + 4):
        RocksDBStore(str(path)).close()
    logs = [p for p in path.iterdir() if p.name.startswith("LOG")]
    assert 1 <= len(logs) <= INFO_LOGS_KEPT


def test_a_secondary_loads_table_files_on_the_calling_thread(tmp_path: Path) -> None:
    """RocksDB would start and join 15 threads per column family at every catch-up; the
    secondary's options (as its info LOG records them) keep it on the calling thread."""
    path = str(tmp_path / "db")
    writer = RocksDBStore(path)
    writer.open_table(SPEC)
    reader = RocksDBStore(path, mode="secondary")
    assert opening_threads(Path(str(reader._opened.secondary_dir)) / "LOG") == 1
    assert opening_threads(Path(path) / "LOG") == 16  # the writer keeps RocksDB's default
    reader.close()
    writer.close()


def opening_threads(log: Path) -> int:
    found = re.search(r"Options\.max_file_opening_threads: (\d+)", log.read_text())
    assert found is not None, log
    return int(found.group(1))
