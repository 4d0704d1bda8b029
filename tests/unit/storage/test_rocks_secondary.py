"""A secondary rocks_db instance catches up only when its writer wrote something, and then
sees every write: rows in the WAL, rows flushed to SST files, a reopened writer's new WAL,
also through a view of links; it lets go of the files of a table the writer dropped."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hps.errors import BackendError, ConfigError
from hps.storage import rocks_open
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


def deleted_files_held(path: str) -> list[str]:
    """Files of the database at ``path`` deleted but still open in this process."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(path) and target.endswith("(deleted)"):
                held.append(target)
    return held


def test_a_secondary_lets_go_of_a_dropped_table_s_files(tmp_path: Path) -> None:
    """A column family the writer dropped (a version retired) had its files kept open by
    every secondary that held it, their disk space pinned until the process ended."""
    path = str(tmp_path / "db")
    later = TableSpec("m", "t", 4, version=2)
    writer = RocksDBStore(path)
    for spec in (SPEC, later):
        writer.open_table(spec)
        keys = np.arange(1000, dtype=np.int64)
        writer.insert(spec.name, keys, rows(keys.tolist(), 0.5))
    writer._db.flush()  # SST files, which a secondary opens
    reader = RocksDBStore(path, mode="secondary")
    reader.open_table(SPEC)  # serving version 1; version 2's files opened too
    reader.catch_up()
    writer.drop_table(later.name)
    writer.close()  # the writer lets go of them: deleted
    reader.catch_up()
    assert reader.reopens == 1 and deleted_files_held(path) == []
    assert found(reader, [1, 999]) == [True, True]  # the table it serves, as before
    reader.open_table(TableSpec("m", "u", 4))  # a table declared later: none yet
    assert found(reader, [1, 2]) == [True, True]
    reader.close()


def test_a_secondary_reading_through_a_view_follows_its_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that may not write L3's folder reads it through a view of links: its
    catch-ups see the writer's new WAL, MANIFEST and SST files (flushes, compactions, a
    writer reopened), and its view keeps no link to a file the writer deleted."""
    path = str(tmp_path / "db")
    writer = RocksDBStore(path)
    writer.open_table(SPEC)
    writer.insert(SPEC.name, np.array([1], np.int64), rows([1], 0.5), durable=True)
    monkeypatch.setattr(rocks_open, "may_write", lambda _: False)  # e.g. another user's L3
    reader = RocksDBStore(path, mode="secondary")
    reader.open_table(SPEC)
    view = reader._opened.view
    assert view is not None
    for key in range(2, 6):
        writer.insert(SPEC.name, np.array([key], np.int64), rows([key], 0.5), durable=True)
        writer._db.flush()  # an SST file, a MANIFEST write, a new WAL
        reader.catch_up()
        assert found(reader, list(range(1, key + 1))) == [True] * key, key
    writer._db.compact_range(None, None)  # the flushed files replaced, deleted
    writer.close()
    writer = RocksDBStore(path)  # a new MANIFEST and WAL
    writer.open_table(SPEC)
    writer.insert(SPEC.name, np.array([6], np.int64), rows([6], 0.5), durable=True)
    reader.catch_up()
    assert found(reader, list(range(1, 7))) == [True] * 6
    links = [os.path.join(view, name) for name in os.listdir(view)]
    assert all(os.path.exists(link) for link in links)  # none dangling
    assert reader.reopens == 0
    reader.close()
    writer.close()


def test_a_table_imported_again_shows_in_secondaries_that_outlive_it(tmp_path: Path) -> None:
    """``hps import --force`` empties a version 1 table in place: a secondary sees the new
    rows only, and one opened later follows a table created after it without crashing
    (a column family dropped and created again under its name made that catch-up a
    segmentation fault: run in a child process, several times)."""
    script = f"""
import numpy as np
from hps.storage.rocks_db import RocksDBStore
from hps.types import TableSpec
T, U = TableSpec("m", "t", 4), TableSpec("m", "u", 4)
keys = np.arange(4, dtype=np.int64)
for n in range(4):
    path = {str(tmp_path)!r} + f"/db{{n}}"
    writer = RocksDBStore(path)
    writer.open_table(T)
    writer.insert(T.name, keys, np.zeros((4, 4), np.float32), durable=True)
    early = RocksDBStore(path, mode="secondary")
    early.open_table(T)
    writer.drop_table(T.name)  # what --force does before importing again
    writer.open_table(T)
    writer.insert(T.name, keys[:2], np.ones((2, 4), np.float32), durable=True)
    early.catch_up()
    values, found = early.fetch(T.name, keys)
    assert found.tolist() == [True, True, False, False], found
    assert (values[:2] == 1).all()
    late = RocksDBStore(path, mode="secondary")
    late.open_table(T)
    late.open_table(U)  # declared before the writer creates it
    writer.open_table(U)
    writer.insert(U.name, keys, np.ones((4, 4), np.float32), durable=True)
    late.catch_up()
    assert late.fetch(U.name, keys)[1].all()
    for store in (early, late, writer):
        store.close()
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[3])  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


F16 = TableSpec("m", "f", 8, row_dtype="float16")
I8 = TableSpec("m", "f", 8, row_dtype="int8")  # rows of 16 bytes too, scale and offset after
NEAR_ONE = 1 + np.linspace(0, 0.01, 10 * 8, dtype=np.float32).reshape(10, 8)


def test_a_secondary_refuses_a_table_created_again_in_another_format(tmp_path: Path) -> None:
    """The writer drops a float16 table and creates it again as int8 of the same dim
    (``hps import --force``): after its next catch-up a secondary that opened it as
    float16 refuses to read it (it decoded the int8 rows as float16: inf, 1712) until the
    table is opened again as recorded; a new secondary reads the int8 rows."""
    path = str(tmp_path / "db")
    keys = np.arange(10, dtype=np.int64)
    writer = RocksDBStore(path)
    writer.open_table(F16)
    writer.insert(F16.name, keys, F16.fmt.encode(NEAR_ONE), durable=True)
    reader = RocksDBStore(path, mode="secondary")
    reader.open_table(F16)
    np.testing.assert_array_equal(reader.fetch(F16.name, keys)[0], F16.fmt.encode(NEAR_ONE))
    writer.drop_table(F16.name)
    writer.open_table(I8)
    new_rows = I8.fmt.encode(NEAR_ONE * 2)
    writer.insert(I8.name, keys, new_rows, durable=True)
    reader.catch_up()
    calls = (
        lambda: reader.fetch(F16.name, keys),
        lambda: reader.fetch_versions(F16.name, keys),
        lambda: list(reader.dump(F16.name)),
    )
    for call in calls:
        with pytest.raises(BackendError, match=(
            r"(fetch|dump) m\.f refused: this process opened table m\.f as float16 rows of "
            r"dimension 8, but the database now records it as int8 rows of dimension 8 .*"
            r"hps reload"
        )):  # fmt: skip
            call()
    with pytest.raises(ConfigError, match="holds int8 rows of dimension 8"):
        reader.open_table(F16)  # as configured before: refused as at any open
    reader.open_table(I8)  # a reload with the new configuration
    values, found = reader.fetch(I8.name, keys)
    assert found.all()
    np.testing.assert_array_equal(values, new_rows)
    late = RocksDBStore(path, mode="secondary")
    late.open_table(I8)
    np.testing.assert_array_equal(late.fetch(I8.name, keys)[0], new_rows)
    for store in (late, reader, writer):
        store.close()


def test_a_secondary_goes_on_when_a_table_comes_back_in_its_format(tmp_path: Path) -> None:
    """Dropped, a table is no error; created again in its format, a secondary that
    opened it before reads the new rows; one that opened a table before the writer created
    it reads it once created, in its format, and refuses it in another."""
    path = str(tmp_path / "db")
    keys = np.arange(10, dtype=np.int64)
    writer = RocksDBStore(path)
    writer.open_table(F16)
    writer.insert(F16.name, keys, F16.fmt.encode(NEAR_ONE), durable=True)
    reader = RocksDBStore(path, mode="secondary")
    reader.open_table(F16)
    early = TableSpec("m", "early", 8, row_dtype="float16")
    other = TableSpec("m", "other", 4)
    reader.open_table(early)  # declared before the writer creates them
    reader.open_table(other)
    writer.drop_table(F16.name)
    reader.catch_up()
    reader.fetch(F16.name, keys)  # no record is no error (the rows, old or none, are float16)
    writer.open_table(F16)
    writer.insert(F16.name, keys[:5], F16.fmt.encode(NEAR_ONE[:5] * 3), durable=True)
    writer.open_table(early)
    writer.insert(early.name, keys, F16.fmt.encode(NEAR_ONE), durable=True)
    writer.open_table(TableSpec("m", "other", 8, row_dtype="int8"))
    writer.insert("m.other", keys, I8.fmt.encode(NEAR_ONE), durable=True)
    reader.catch_up()
    values, found = reader.fetch(F16.name, keys)
    assert found.tolist() == [True] * 5 + [False] * 5
    np.testing.assert_array_equal(values[:5], F16.fmt.encode(NEAR_ONE[:5] * 3))
    np.testing.assert_array_equal(reader.fetch(early.name, keys)[0], F16.fmt.encode(NEAR_ONE))
    with pytest.raises(BackendError, match="m.other as float32 rows of dimension 4, but .* int8"):
        reader.fetch(other.name, keys)
    reader.close()
    writer.close()
