"""rocks_db's row format 2 (vector + version in one value) and databases of format 1.

Format-1 databases (vector only, versions in the ``__hps_version`` side table) are read as
they are, not migrated: their rows keep serving, their versions still protect against
replays, and each row an update rewrites moves to format 2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rocksdict as rd

from hps.rowformat import FLOAT32, FORMATS
from hps.storage import rocks_rows
from hps.storage.rocks_db import RocksDBStore
from hps.tiers import Tiers
from hps.tiers.side_tables import to_limbs
from hps.tiers.versions import VERSION_SUFFIX, RowVersions
from hps.types import TableSpec, UpdateBatch
from hps.updates.applier import Applier

SPEC = TableSpec("m", "t", 3)


def vec(keys: list[int], seed: float) -> np.ndarray:
    return np.array([[k + seed] * 3 for k in keys], dtype=np.float32)


def write_format_1(path: Path, keys: list[int], values: np.ndarray, versions: list[int]) -> None:
    """A database as the code before format 2 wrote it: raw rows, versions on the side."""
    opts = rd.Options(raw_mode=True)
    opts.create_if_missing(True)
    db = rd.Rdict(str(path), opts)
    k = np.array(keys, dtype="<i8").view("V8").tolist()
    data = db.create_column_family(SPEC.name, rd.Options(raw_mode=True))
    side = db.create_column_family(SPEC.name + VERSION_SUFFIX, rd.Options(raw_mode=True))
    limbs = to_limbs(np.array(versions, dtype=np.uint64))
    for key, row, lim in zip(k, values, limbs, strict=True):
        data[key] = row.tobytes()
        side[key] = lim.tobytes()
    db.close()


def test_decode_reads_both_formats_in_one_batch() -> None:
    values = vec([1, 2, 3], 0.5)
    new = rocks_rows.encode(values[:2], np.array([7, 9], np.uint64))
    got = [new[0], None, values[2].tobytes(), new[1]]
    v, found, versions, has_version = rocks_rows.decode(got, FLOAT32, 3)
    assert found.tolist() == [True, False, True, True]
    assert has_version.tolist() == [True, False, False, True]
    assert versions.tolist() == [7, 0, 0, 9]
    np.testing.assert_array_equal(v[[0, 2, 3]], values[[0, 2, 1]])


def test_one_value_per_row_carries_the_version(tmp_path: Path) -> None:
    store = RocksDBStore(str(tmp_path / "db"))
    store.open_table(SPEC)
    keys = np.array([5, 6], np.int64)
    store.insert_versioned(SPEC.name, keys, vec([5, 6], 0.25), np.array([3, 2**63], np.uint64))
    versions, has = store.fetch_versions(SPEC.name, np.array([5, 6, 7], np.int64))
    assert versions.tolist() == [3, 2**63, 0] and has.tolist() == [True, True, False]
    values, found = store.fetch(SPEC.name, keys)
    np.testing.assert_array_equal(values, vec([5, 6], 0.25))
    ((dk, dv),) = list(store.dump(SPEC.name))
    assert sorted(dk.tolist()) == [5, 6]
    store.close()


def test_a_format_1_database_is_read_and_its_versions_still_hold(tmp_path: Path) -> None:
    path = tmp_path / "old"
    write_format_1(path, [1, 2, 3], vec([1, 2, 3], 0.5), [10, 10, 10])
    store = RocksDBStore(str(path))
    applier = Applier({SPEC.name: SPEC}, Tiers(None, store))
    assert isinstance(applier._routes[SPEC.name].versions, RowVersions)
    values, found = store.fetch(SPEC.name, np.array([1, 2, 3, 4], np.int64))
    assert found.tolist() == [True, True, True, False]
    np.testing.assert_array_equal(values[:3], vec([1, 2, 3], 0.5))

    keys = np.array([1, 2], np.int64)
    (stale,) = applier.apply([UpdateBatch(SPEC.name, keys, vec([1, 2], 0.9), 5)])
    assert stale.stale == 2  # older than the versions of the side table: refused
    (fresh,) = applier.apply([UpdateBatch(SPEC.name, keys, vec([1, 2], 0.7), 11)])
    assert fresh.stale == 0
    versions, has = store.fetch_versions(SPEC.name, np.array([1, 2, 3], np.int64))
    assert has.tolist() == [True, True, False]  # rewritten rows are format 2 now
    assert versions.tolist()[:2] == [11, 11]
    values, _ = store.fetch(SPEC.name, np.array([1, 2, 3], np.int64))  # a mixed batch
    np.testing.assert_array_equal(values, np.concatenate([vec([1, 2], 0.7), vec([3], 0.5)]))
    assert sorted(np.concatenate([k for k, _ in store.dump(SPEC.name)]).tolist()) == [1, 2, 3]

    # deletes keep a tombstone: an older upsert cannot bring the key back
    applier.apply([UpdateBatch(SPEC.name, np.array([3], np.int64), None, 20, delete=True)])
    (late,) = applier.apply([UpdateBatch(SPEC.name, np.array([3], np.int64), vec([3], 1), 15)])
    assert late.stale == 1
    assert not store.fetch(SPEC.name, np.array([3], np.int64))[1][0]
    store.close()


def test_replay_after_a_restart_changes_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    batch = UpdateBatch(SPEC.name, np.array([1, 2], np.int64), vec([1, 2], 0.5), 7)
    newer = UpdateBatch(SPEC.name, np.array([2], np.int64), vec([2], 0.8), 8)
    store = RocksDBStore(path)
    Applier({SPEC.name: SPEC}, Tiers(None, store)).apply([batch, newer])
    store.close()
    store = RocksDBStore(path)
    (replayed,) = Applier({SPEC.name: SPEC}, Tiers(None, store)).apply([batch])
    assert replayed.stale == 1 and replayed.keys.tolist() == [1]  # equal version re-applied
    values, _ = store.fetch(SPEC.name, np.array([1, 2], np.int64))
    np.testing.assert_array_equal(values, np.concatenate([vec([1], 0.5), vec([2], 0.8)]))
    store.close()


def test_decode_keeps_the_stored_rows_of_every_format() -> None:
    """Format 2 of a float16 or int8 table: the stored row's bytes, then the version; a mixed
    batch of lengths is refused for a format that never had format 1."""
    values = vec([1, 2, 3], 0.5)
    for fmt in (FORMATS["float16"], FORMATS["int8"]):
        stored = fmt.encode(values)
        got = rocks_rows.encode(stored, np.array([1, 2, 3], np.uint64))
        assert {len(g) for g in got} == {fmt.row_bytes(3) + rocks_rows.VERSION_BYTES}
        v, found, versions, has = rocks_rows.decode([got[2], None, got[0]], fmt, 3)
        assert v.dtype == fmt.dtype and v.shape == (3, fmt.width(3))
        np.testing.assert_array_equal(v[[0, 2]], stored[[2, 0]])
        assert found.tolist() == has.tolist() == [True, False, True]
        assert versions.tolist() == [3, 0, 1]


def test_a_database_from_before_formats_holds_float32_rows(tmp_path: Path) -> None:
    """No format recorded: float32 rows; another format is refused, float32 is recorded."""
    from hps.errors import ConfigError

    write_format_1(tmp_path / "db", [1, 2], vec([1, 2], 0.5), [4, 5])
    store = RocksDBStore(str(tmp_path / "db"))
    with pytest.raises(ConfigError, match="holds float32 rows of dimension 3.*--force"):
        store.open_table(TableSpec("m", "t", 3, row_dtype="int8"))
    store.open_table(SPEC)
    got, found = store.fetch(SPEC.name, np.array([1, 2], np.int64))
    assert found.all()
    np.testing.assert_array_equal(got, vec([1, 2], 0.5))
    store.close()
    store = RocksDBStore(str(tmp_path / "db"))  # recorded now: refused from the record
    with pytest.raises(ConfigError, match="holds float32 rows"):
        store.open_table(TableSpec("m", "t", 3, row_dtype="float16"))
    store.close()
