"""Importing a version beside the live one, and retiring one (real RocksDB files)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.config import PSConfig
from hps.errors import BackendError, ConfigError, SparseModelError
from hps.io.sparse_model import write_sparse_model
from hps.tiers import Tiers
from hps.triton.serving import prepare_tables
from hps.versions import VersionRegistry
from hps.versions.rollout import import_version, retire, version_entry
from tests.helpers import make_config, rows

KEYS = np.arange(50, dtype=np.int64)


def tables(folder: Path, seed: int) -> list[str]:
    paths = []
    for name, dim in (("t0", 4), ("t1", 8)):
        write_sparse_model(folder / name, KEYS, rows(KEYS, dim, seed))
        paths.append(str(folder / name))
    return paths


@pytest.fixture
def config(tmp_path: Path) -> PSConfig:
    doc = make_config(tmp_path).model("demo").model_dump(mode="json")
    doc["sparse_files"] = tables(tmp_path / "v1", seed=0)
    doc["dense_file"] = str(tmp_path / "dense.npz")
    np.savez(tmp_path / "dense.npz", w=np.ones(3, np.float32))
    return make_config(tmp_path, models=[doc])


def l3_rows(config: PSConfig, version: int, keys: np.ndarray) -> np.ndarray:
    """Table t0's rows of ``version`` in L3."""
    spec = config.model("demo").at_version(version).tables[0]
    tiers = Tiers.open(config, l3_mode="read_write", l2=False)
    try:
        assert tiers.persistent is not None
        tiers.open_tables([spec])
        values, found = tiers.persistent.fetch(spec.name, keys)
        return values[found]
    finally:
        tiers.close()


def test_a_version_is_imported_beside_the_live_one(config: PSConfig, tmp_path: Path) -> None:
    prepare_tables(config)  # version 1, as ps.json names it (hps serve does this)
    entry = version_entry(config, "demo", sparse_files=tables(tmp_path / "v2", seed=7))
    assert import_version(config, entry, 2) == {"demo.t0@2": 50, "demo.t1@2": 50}
    np.testing.assert_array_equal(l3_rows(config, 1, KEYS[:3]), rows(KEYS[:3], 4, 0))
    np.testing.assert_array_equal(l3_rows(config, 2, KEYS[:3]), rows(KEYS[:3], 4, 7))
    registry = VersionRegistry(config)
    assert registry.live("demo") == 1 and registry.get("demo", 2).state == "ready"
    dense = Path(registry.model_at("demo", 2).dense_file)
    assert dense.parent.name == "2" and dense.is_file()  # a copy: the version's own weights
    (tmp_path / "dense.npz").unlink()
    assert dense.is_file()


def test_a_failed_import_leaves_nothing(config: PSConfig, tmp_path: Path) -> None:
    paths = tables(tmp_path / "v2", seed=7)
    (Path(paths[1]) / "emb_vector").write_bytes(b"\0" * 12)  # not whole rows of dim 8
    with pytest.raises(SparseModelError, match="emb_vector: 12 bytes"):
        import_version(config, version_entry(config, "demo", sparse_files=paths), 2)
    assert [v.version for v in VersionRegistry(config).versions("demo")] == [1]
    assert l3_rows(config, 2, KEYS).size == 0
    with pytest.raises(ConfigError, match="2 tables but 1 sparse files"):
        version_entry(config, "demo", sparse_files=paths[:1])


def test_an_import_run_again_after_a_failure_imports_every_table(
    config: PSConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tables of a failed import are dropped with their import records: the same
    command again fills them all, not only the one that failed."""
    from hps.loading import imports

    prepare_tables(config)
    paths = tables(tmp_path / "v2", seed=7)
    load = imports.Loader.load

    def failing_t1(self: imports.Loader, source: imports.TableSource) -> int:
        if source.spec.table == "t1":
            raise BackendError("disk full")
        return load(self, source)

    monkeypatch.setattr(imports.Loader, "load", failing_t1)
    with pytest.raises(BackendError, match="disk full"):
        import_version(config, version_entry(config, "demo", sparse_files=paths), 2)
    monkeypatch.setattr(imports.Loader, "load", load)
    got = import_version(config, version_entry(config, "demo", sparse_files=paths), 2)
    assert got == {"demo.t0@2": 50, "demo.t1@2": 50}
    np.testing.assert_array_equal(l3_rows(config, 2, KEYS[:3]), rows(KEYS[:3], 4, 7))


def test_a_restart_imports_a_retrained_version_1_only_while_it_is_live(
    config: PSConfig, tmp_path: Path
) -> None:
    """Kept for rollback below a later live version, version 1 is the snapshot it was: a
    retrain of the ps.json's files is not imported into it (a rollback would serve it)."""
    prepare_tables(config)
    import_version(
        config, version_entry(config, "demo", sparse_files=tables(tmp_path / "v2", 7)), 2
    )
    VersionRegistry(config).set_live("demo", 2, served=[1, 2])
    tables(tmp_path / "v1", seed=99)  # the ps.json's files retrained in place
    assert prepare_tables(config) == {}
    np.testing.assert_array_equal(l3_rows(config, 1, KEYS[:3]), rows(KEYS[:3], 4, 0))
    VersionRegistry(config).set_live("demo", 1)  # rolled back: version 1 is live again
    assert prepare_tables(config) == {"demo.t0": 50, "demo.t1": 50}  # its retrain now
    np.testing.assert_array_equal(l3_rows(config, 1, KEYS[:3]), rows(KEYS[:3], 4, 99))


def test_a_retire_waits_for_an_activation_of_another_process(
    config: PSConfig, tmp_path: Path
) -> None:
    """The node's lock of version changes is a file lock: held by an activation (here, by
    this thread through another open file, as another process would), a retire waits."""
    import threading

    entry = version_entry(config, "demo", sparse_files=tables(tmp_path / "v2", seed=7))
    import_version(config, entry, 2)
    retired = threading.Event()

    def retire_2() -> None:
        retire(config, "demo", 2)
        retired.set()

    with VersionRegistry(config).changing():
        thread = threading.Thread(target=retire_2)
        thread.start()
        thread.join(0.3)
        assert not retired.is_set()  # waiting for the lock
        assert VersionRegistry(config).get("demo", 2).state == "ready"
    thread.join(30)  # hang guard
    assert retired.is_set() and VersionRegistry(config).get("demo", 2).state == "retired"


def test_a_failed_import_whose_rows_cannot_be_dropped_stays_to_be_retired(
    config: PSConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own error is raised; forgetting it would leave rows that a later import of the
    number mixes with, so it stays recorded (abandoned: retire drops it)."""
    from hps.loading import imports
    from hps.versions import rollout

    prepare_tables(config)
    load, drop = imports.Loader.load, rollout.drop_versions

    def failing(self: imports.Loader, source: imports.TableSource) -> int:
        if source.spec.table == "t1":
            raise BackendError("disk full")
        return load(self, source)

    def locked(*args: object) -> None:
        raise BackendError("rocks_db: L3 is locked by hps consume")

    monkeypatch.setattr(imports.Loader, "load", failing)
    monkeypatch.setattr(rollout, "drop_versions", locked)
    paths = tables(tmp_path / "v2", seed=7)
    with pytest.raises(BackendError, match="disk full"):
        import_version(config, version_entry(config, "demo", sparse_files=paths), 2)
    assert VersionRegistry(config).get("demo", 2).state == "loading"
    assert l3_rows(config, 2, KEYS[:3]).size == 3 * 4  # t0's rows are still there
    monkeypatch.setattr(rollout, "drop_versions", drop)
    retire(config, "demo", 2)  # abandoned: its importer is gone
    assert l3_rows(config, 2, KEYS).size == 0


def test_retire_drops_the_rows_of_a_version(config: PSConfig, tmp_path: Path) -> None:
    entry = version_entry(config, "demo", sparse_files=tables(tmp_path / "v2", seed=7))
    import_version(config, entry, 2)
    with pytest.raises(ConfigError, match="is live"):
        retire(config, "demo", 1)
    retire(config, "demo", 2)
    assert VersionRegistry(config).get("demo", 2).state == "retired"
    assert l3_rows(config, 2, KEYS).size == 0
    retire(config, "demo", 2)  # again: nothing to do


def test_a_version_whose_import_died_can_be_retired(config: PSConfig) -> None:
    from hps.versions.rollout import _importing

    registry = VersionRegistry(config)
    with _importing(config, "demo", 2):  # an import in progress (this process holds it)
        registry.begin(config.model("demo"), 2)
        with pytest.raises(ConfigError, match="being imported"):
            retire(config, "demo", 2)
    retire(config, "demo", 2)  # nobody imports it any more: abandoned
    assert registry.get("demo", 2).state == "retired"


def column_families(config: PSConfig) -> list[str]:
    import rocksdict as rd

    return rd.Rdict.list_cf(config.persistent_db.path, rd.Options(raw_mode=True))


def test_a_retire_whose_drop_fails_is_recorded_and_done_again(
    config: PSConfig, tmp_path: Path
) -> None:
    """L3's writer lock held (here by this process, as hps consume would): the version is
    retired (nothing serves it) with its rows left, and the next retire drops them."""
    from hps.storage.rocks_db import RocksDBStore

    import_version(
        config, version_entry(config, "demo", sparse_files=tables(tmp_path / "v2", 7)), 2
    )
    holder = RocksDBStore(config.persistent_db.path)
    try:
        with pytest.raises(BackendError, match="version 2 is retired but its rows could not"):
            retire(config, "demo", 2)
    finally:
        holder.close()
    info = VersionRegistry(config).get("demo", 2)
    assert (info.state, info.rows_left) == ("retired", True)
    assert VersionRegistry(config).rows_left("demo") == [2]
    assert "demo.t0@2" in column_families(config)
    retire(config, "demo", 2)  # retired already, rows left: dropped now
    assert not VersionRegistry(config).get("demo", 2).rows_left
    assert "demo.t0@2" not in column_families(config)
