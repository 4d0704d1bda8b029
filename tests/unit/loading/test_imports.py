"""An import reads, validates, loads and records one version of each table's files, and
records it only once its rows are durable (real RocksDB files)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from hps.config import PSConfig
from hps.errors import ConfigError, FormatError
from hps.io.sparse_model import write_sparse_model
from hps.loading import imports
from hps.loading.imports import ImportRecord, import_tables
from hps.loading.loader import Loader, TableSource
from hps.storage.rocks_db import RocksDBStore
from hps.tiers import Tiers
from hps.topology import topology
from tests.helpers import make_config, rows

KEYS = np.arange(100, dtype=np.int64)


@pytest.fixture
def config(tmp_path: Path) -> PSConfig:
    write_sparse_model(tmp_path / "t0.model", KEYS, rows(KEYS, 4))
    model = {
        "model": "demo",
        "embedding_table_names": ["t0"],
        "embedding_vecsize_per_table": [4],
        "sparse_files": [str(tmp_path / "t0.model")],
        "gpucache": False,
    }
    return make_config(tmp_path, models=[model])


def l3_rows(config: PSConfig) -> np.ndarray:
    tiers = Tiers.open(config, l3_mode="read_only", l2=False)
    try:
        tiers.open_tables(config.tables)
        assert tiers.persistent is not None
        values, found = tiers.persistent.fetch("demo.t0", KEYS)
        assert found.all()
        return values
    finally:
        tiers.close()


def publish(folder: Path, vectors: np.ndarray) -> None:
    """What a trainer does: write new files beside, rename them over the old ones."""
    write_sparse_model(folder.with_name("new.model"), KEYS, vectors)
    for name in ("key", "emb_vector"):
        os.replace(folder.with_name("new.model") / name, folder / name)


def load_after(monkeypatch: pytest.MonkeyPatch, step: object) -> None:
    """Run ``step(source)`` as the load of a table begins (after its validation)."""
    real = Loader.load

    def load(self: Loader, source: TableSource) -> int:
        step(source)  # type: ignore[operator]
        return real(self, source)

    monkeypatch.setattr(imports.Loader, "load", load)


def test_files_replaced_after_validation_are_not_loaded_unvalidated(
    config: PSConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = rows(KEYS, 4, seed=3)
    bad[7, 1] = np.nan
    load_after(monkeypatch, lambda _: publish(tmp_path / "t0.model", bad))
    assert import_tables(config, topology(config)) == {"demo.t0": 100}
    np.testing.assert_array_equal(l3_rows(config), rows(KEYS, 4))  # the validated files
    monkeypatch.undo()
    with pytest.raises(FormatError, match="NaN"):  # the new files: not recorded as imported
        import_tables(config, topology(config))


def test_files_replaced_during_an_import_are_imported_by_the_next(
    config: PSConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    load_after(monkeypatch, lambda _: publish(tmp_path / "t0.model", rows(KEYS, 4, seed=9)))
    assert import_tables(config, topology(config)) == {"demo.t0": 100}
    assert "replaced while it was imported" in caplog.text
    monkeypatch.undo()
    assert import_tables(config, topology(config)) == {"demo.t0": 100}  # not "unchanged"
    np.testing.assert_array_equal(l3_rows(config), rows(KEYS, 4, seed=9))
    assert import_tables(config, topology(config)) == {}


def test_files_rewritten_in_place_during_an_import_fail_it_unrecorded(
    config: PSConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def rewrite(_: TableSource) -> None:
        with open(tmp_path / "t0.model" / "emb_vector", "r+b") as f:
            f.write(rows(KEYS, 4, seed=5).tobytes())

    load_after(monkeypatch, rewrite)
    with pytest.raises(FormatError, match=r"demo\.t0: .*emb_vector changed while it was imported"):
        import_tables(config, topology(config))
    state = topology(config).state_dir
    assert state is not None and "demo.t0" not in ImportRecord(state).tables
    monkeypatch.undo()
    import_tables(config, topology(config))  # no record: L3 is read, and holds them now
    assert "demo.t0" in ImportRecord(state).tables
    np.testing.assert_array_equal(l3_rows(config), rows(KEYS, 4, seed=5))


def test_the_record_is_written_after_a_synced_write_and_synced_itself(
    config: PSConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    insert, save, fsync = RocksDBStore.insert, ImportRecord._save, os.fsync

    def spy_insert(self: RocksDBStore, *args: object, durable: bool = False) -> None:
        events.append(f"insert durable={durable}")
        insert(self, *args, durable=durable)  # type: ignore[arg-type]

    def spy_save(self: ImportRecord) -> None:
        events.append("record")
        save(self)
        events.append(f"record on disk: {'demo.t0' in self.path.read_text()}")

    def spy_fsync(fd: int) -> None:
        events.append("fsync")
        fsync(fd)

    monkeypatch.setattr(RocksDBStore, "insert", spy_insert)
    monkeypatch.setattr(ImportRecord, "_save", spy_save)
    monkeypatch.setattr(os, "fsync", spy_fsync)
    import_tables(config, topology(config))
    start = events.index("record")
    assert events[start - 1] == "insert durable=True"  # the load's last write: synced
    assert events[start:] == ["record", "fsync", "fsync", "record on disk: True"]  # file, folder


def test_an_empty_l3_folder_is_a_new_database(config: PSConfig) -> None:
    """A fresh volume mounted where L3 goes: imported into, not opened read-only as a
    database that is not there."""
    Path(config.persistent_db.path).mkdir(parents=True)
    assert import_tables(config, topology(config)) == {"demo.t0": KEYS.size}
    np.testing.assert_array_equal(l3_rows(config), rows(KEYS, 4))


# -- unchanged or not: decided on the whole content, never a sample -------------------------

UNSAMPLED_ROW = 2  # a row the 64-row sample of 100 rows the import used to compare skipped


def retrained(row: int = UNSAMPLED_ROW) -> np.ndarray:
    """The table's vectors with one row retrained (incremental training)."""
    vectors = rows(KEYS, 4)
    vectors[row] += 1.0
    return vectors


def record_of(config: PSConfig) -> ImportRecord:
    state = topology(config).state_dir
    assert state is not None
    return ImportRecord(state)


def no_load(monkeypatch: pytest.MonkeyPatch) -> None:
    def load(self: Loader, source: TableSource) -> int:
        raise AssertionError(f"{source.spec.name} imported again")

    monkeypatch.setattr(imports.Loader, "load", load)


def test_a_partly_retrained_table_is_imported_again(config: PSConfig, tmp_path: Path) -> None:
    assert import_tables(config, topology(config)) == {"demo.t0": 100}
    publish(tmp_path / "t0.model", retrained())
    assert import_tables(config, topology(config)) == {"demo.t0": 100}
    np.testing.assert_array_equal(l3_rows(config), retrained())
    assert import_tables(config, topology(config)) == {}


def test_files_of_the_same_content_are_unchanged_and_restamped(
    config: PSConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New files (another stamp) of the content imported: not imported again; the record
    takes their stamp, so the next import reads nothing."""
    import_tables(config, topology(config))
    publish(tmp_path / "t0.model", rows(KEYS, 4))
    source = imports.sparse_sources(config)[0]
    assert not record_of(config).current(source)
    no_load(monkeypatch)
    assert import_tables(config, topology(config)) == {}
    assert record_of(config).current(source)


def test_a_record_without_digests_is_decided_on_l3s_rows(
    config: PSConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older release's record (stamps alone): files that changed are compared with L3
    row by row; the same rows are recorded with their digest, others imported again."""
    import_tables(config, topology(config))
    record = record_of(config)
    record.path.write_text('{"demo.t0": ["old", 1, 2, "stamp", 3, 4]}')
    with monkeypatch.context() as patched:
        no_load(patched)
        assert import_tables(config, topology(config)) == {}  # L3 holds every row
    assert record_of(config).digest("demo.t0") is not None
    record.path.write_text('{"demo.t0": ["old", 1, 2, "stamp", 3, 4]}')
    publish(tmp_path / "t0.model", retrained())
    assert import_tables(config, topology(config)) == {"demo.t0": 100}
    np.testing.assert_array_equal(l3_rows(config), retrained())


def test_a_read_only_l3_is_refused_for_partly_retrained_files(
    config: PSConfig, tmp_path: Path
) -> None:
    import_tables(config, topology(config))
    read_only = config.model_copy(
        update={"persistent_db": config.persistent_db.model_copy(update={"read_only": True})}
    )
    publish(tmp_path / "t0.model", rows(KEYS, 4))  # the same content: served
    assert import_tables(read_only, topology(read_only)) == {}
    publish(tmp_path / "t0.model", retrained())
    with pytest.raises(ConfigError, match=r"read-only and does not hold demo\.t0"):
        import_tables(read_only, topology(read_only))
    record_of(config).path.unlink()  # a volume of L3 alone: L3's rows decide
    with pytest.raises(ConfigError, match=r"read-only and does not hold demo\.t0"):
        import_tables(read_only, topology(read_only))
    publish(tmp_path / "t0.model", rows(KEYS, 4))
    assert import_tables(read_only, topology(read_only)) == {}


# -- a damaged record ------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", '{"demo.t0": [', "[1]", "null", "\udcff"])
def test_a_damaged_record_is_read_as_empty_with_a_warning(
    config: PSConfig, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Empty, cut short, not an object: the tables are checked again (L3 holds them: not
    imported again) and the record is written anew."""
    import_tables(config, topology(config))
    record = record_of(config)
    record.path.write_text(text, errors="surrogateescape")
    assert import_tables(config, topology(config)) == {}
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and f"{record.path}: damaged import record" in warnings[0]
    assert record_of(config).digest("demo.t0") is not None  # written anew


# -- an interrupted import: never recorded over rows of other files --------------------------


class Crash(BaseException):
    """The process dies here (nothing after it runs, the record is left as it is)."""


def crash_after_half(monkeypatch: pytest.MonkeyPatch) -> None:
    """The load of a table writes half its rows to L3 (durably), then the process dies."""

    def load(self: Loader, source: TableSource) -> int:
        keys, vectors = next(iter(source.chunks()))
        half = keys.size // 2
        assert self.tiers.persistent is not None
        rows_ = vectors[:half].astype(source.spec.fmt.dtype)
        self.tiers.persistent.insert(source.spec.name, keys[:half], rows_, durable=True)
        raise Crash

    monkeypatch.setattr(imports.Loader, "load", load)


def other_files(config: PSConfig, tmp_path: Path, seed: int, **table: object) -> PSConfig:
    """The ps.json naming other files of demo.t0 (same keys, other vectors)."""
    write_sparse_model(tmp_path / f"b{seed}.model", KEYS, rows(KEYS, 4, seed=seed))
    model = {
        "model": "demo",
        "embedding_table_names": ["t0"],
        "embedding_vecsize_per_table": [4],
        "sparse_files": [str(tmp_path / f"b{seed}.model")],
        "gpucache": False,
        **table,
    }
    return make_config(tmp_path, models=[model])


def test_an_import_interrupted_mid_table_leaves_it_to_be_imported_again(
    config: PSConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert import_tables(config, topology(config)) == {"demo.t0": 100}  # files A
    crash_after_half(monkeypatch)
    with pytest.raises(Crash):  # files B: half their rows written over A's
        import_tables(other_files(config, tmp_path, seed=7), topology(config))
    assert "demo.t0" not in record_of(config).tables  # forgotten before the first write
    monkeypatch.undo()
    assert import_tables(config, topology(config)) == {"demo.t0": 100}  # A again: not unchanged
    np.testing.assert_array_equal(l3_rows(config), rows(KEYS, 4))
    assert import_tables(config, topology(config)) == {}


def test_a_forced_import_interrupted_after_its_drop_is_not_recorded(
    config: PSConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert import_tables(config, topology(config)) == {"demo.t0": 100}
    crash_after_half(monkeypatch)
    wide = other_files(config, tmp_path, seed=7, hps_row_dtype="float16")
    with pytest.raises(Crash):  # dropped, half of the float16 rows written
        import_tables(wide, topology(config), force=True)
    assert "demo.t0" not in record_of(config).tables
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="--force"):  # the ps.json rolled back: not unchanged
        import_tables(config, topology(config))
    assert import_tables(config, topology(config), force=True) == {"demo.t0": 100}
    np.testing.assert_array_equal(l3_rows(config), rows(KEYS, 4))


def test_a_batch_of_tables_writes_the_record_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [f"t{i}" for i in range(5)]
    for name in names:
        write_sparse_model(tmp_path / f"{name}.model", KEYS, rows(KEYS, 4))
    model = {
        "model": "demo",
        "embedding_table_names": names,
        "embedding_vecsize_per_table": [4] * len(names),
        "sparse_files": [str(tmp_path / f"{n}.model") for n in names],
        "gpucache": False,
    }
    many = make_config(tmp_path, models=[model])
    saves: list[int] = []
    save = ImportRecord._save

    def spy_save(self: ImportRecord) -> None:
        saves.append(len(self.tables))
        save(self)

    monkeypatch.setattr(ImportRecord, "_save", spy_save)
    monkeypatch.setattr(imports, "RECORD_EVERY_S", float("inf"))  # the batch: one write
    assert len(import_tables(many, topology(many))) == len(names)
    assert saves == [len(names)]  # all loaded and durable, then recorded at once
    saves.clear()
    assert len(import_tables(many, topology(many), force=True)) == len(names)
    assert saves == [0, len(names)]  # forgotten together, recorded together
