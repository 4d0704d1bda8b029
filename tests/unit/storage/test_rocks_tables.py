"""Tables declared together in a writable L3 are created in one open of the database (one
column family at a time syncs the MANIFEST and an OPTIONS file each), with the rows of the
tables it already held kept; a failed open leaves the database open as it was."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rocksdict as rd

from hps.errors import BackendError
from hps.storage import rocks_db
from hps.storage.rocks_db import RocksDBStore
from hps.types import TableSpec

KEYS = np.arange(5, dtype=np.int64)


class _NoOneByOne:
    """The database, with create_column_family refused: new tables must come together."""

    def __init__(self, db: rd.Rdict) -> None:
        self._db = db

    def create_column_family(self, *args: object) -> None:
        raise AssertionError("a column family was created on its own")

    def __getattr__(self, name: str) -> object:
        return getattr(self._db, name)


def _specs(n: int, dim: int = 3) -> list[TableSpec]:
    return [TableSpec(model="m", table=f"t{i}", dim=dim) for i in range(n)]


def _rows(i: int) -> np.ndarray:
    return np.full((KEYS.size, 3), i, dtype=np.float32)


def test_new_tables_are_created_in_one_open_and_held_rows_stay(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    first = RocksDBStore(path)
    held = TableSpec(model="m", table="held", dim=3)
    first.open_table(held)
    first.insert(held.name, KEYS, _rows(7))
    first.close()

    store = RocksDBStore(path)
    store._db = _NoOneByOne(store._db)  # type: ignore[assignment]
    specs = _specs(20)
    store.open_tables([held, *specs])
    for i, spec in enumerate(specs):
        store.insert(spec.name, KEYS, _rows(i))
    np.testing.assert_array_equal(store.fetch(held.name, KEYS)[0], _rows(7))
    store.close()

    again = RocksDBStore(path, mode="read_only")
    again.open_tables([held, *specs])
    for i, spec in enumerate(specs):
        rows, found = again.fetch(spec.name, KEYS)
        assert found.all()
        np.testing.assert_array_equal(rows, _rows(i))
    with pytest.raises(Exception, match="holds float32 rows of dimension 3"):
        again.open_tables([TableSpec(model="m", table="t0", dim=4)])
    again.close()


def test_a_failed_open_leaves_the_database_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "db")
    store = RocksDBStore(path)
    real = rocks_db.open_db

    def refusing(*args: object, create: tuple[str, ...] = (), **kw: object) -> object:
        if create:
            raise BackendError("rocks_db: cannot open: disk full")
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(rocks_db, "open_db", refusing)
    with pytest.raises(BackendError, match="disk full"):
        store.open_tables(_specs(3))
    monkeypatch.undo()
    spec = _specs(1)[0]
    store.open_table(spec)  # one by one: the database is open and writable
    store.insert(spec.name, KEYS, _rows(1))
    np.testing.assert_array_equal(store.fetch(spec.name, KEYS)[0], _rows(1))
    store.close()
