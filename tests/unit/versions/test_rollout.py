"""Importing a version beside the live one, and retiring one (real RocksDB files)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.config import PSConfig
from hps.errors import BackendError, ConfigError, SparseModelError
from hps.io.sparse_model import write_sparse_model
from hps.loading.imports import sparse_sources
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


def edited(config: PSConfig, **change: object) -> PSConfig:
    """``config`` with the model entry changed as a retrain's edit of the ps.json would."""
    doc = config.model("demo").model_dump(mode="json")
    return make_config(Path(config.persistent_db.path).parent, models=[{**doc, **change}])


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"hps_row_dtype": "float16"}, "as float32 rows of dimension 4 but configured as float16"),
        (
            {"embedding_vecsize_per_table": [4, 6]},
            "table t1 is held in L3 (rocks_db) as float32 rows of dimension 8 but configured "
            "as float32 rows of dimension 6",
        ),
    ],
)
def test_a_ps_json_edited_before_the_first_versioned_import_is_refused(
    config: PSConfig, tmp_path: Path, change: dict[str, object], says: str
) -> None:
    """Version 1 would be recorded from the edited entry, in a format or dimension its rows
    are not in: refused, with nothing recorded or written. The entry restored, the new
    version's format comes with the import instead."""
    prepare_tables(config)  # version 1, float32, dims 4 and 8
    retrain = edited(config, **change)
    entry = version_entry(retrain, "demo", sparse_files=tables(tmp_path / "v2", seed=7))
    with pytest.raises(ConfigError, match="restore the entry version 1 was imported from") as exc:
        import_version(retrain, entry, 2)
    assert "model 'demo'" in str(exc.value) and says in str(exc.value)
    registry = VersionRegistry(retrain)
    assert registry.path is not None and not registry.path.exists()  # nothing recorded
    assert [c for c in column_families(config) if "@" in c] == []  # no rows of version 2
    with pytest.raises(ConfigError, match="restore the entry"):
        registry.set_live("demo", 1)  # any first record is checked, not only an import's

    entry = version_entry(config, "demo", sparse_files=tables(tmp_path / "v2", seed=7),
                          row_dtype=["float16"])  # fmt: skip
    import_version(config, entry, 2)
    assert {t.row_dtype for t in registry.model_at("demo", 1).tables} == {"float32"}
    assert {t.row_dtype for t in registry.model_at("demo", 2).tables} == {"float16"}


def test_a_table_added_to_the_ps_json_entry_is_refused(config: PSConfig, tmp_path: Path) -> None:
    """A retrain with one more table, its ps.json entry edited for it: version 1 would be
    recorded with a table it never had (a rollback to it serving default values for it).
    Refused, naming the table, with nothing recorded or written."""
    prepare_tables(config)  # version 1: t0 and t1
    paths = tables(tmp_path / "v2", seed=7)
    write_sparse_model(tmp_path / "v2" / "t2", KEYS, rows(KEYS, 4, 7))
    retrain = edited(
        config,
        embedding_table_names=["t0", "t1", "t2"],
        embedding_vecsize_per_table=[4, 8, 4],
        maxnum_catfeature_query_per_table_per_sample=[2, 3, 2],
        default_value_for_each_table=[0.5, -1.0, 0.0],
        sparse_files=[*config.model("demo").sparse_files, str(tmp_path / "v2" / "t2")],
    )
    entry = version_entry(retrain, "demo", sparse_files=[*paths, str(tmp_path / "v2" / "t2")])
    with pytest.raises(ConfigError, match="restore the entry version 1 was imported from") as exc:
        import_version(retrain, entry, 2)
    said = str(exc.value)
    assert "table t2 is not held by L3 (rocks_db)" in said
    assert "version 1 has no such table" in said and "A retrain edits no part of the entry" in said
    assert "table t0" not in said and "table t1" not in said
    registry = VersionRegistry(retrain)
    assert registry.path is not None and not registry.path.exists()  # nothing recorded
    assert [c for c in column_families(config) if "@" in c or "t2" in c] == []
    with pytest.raises(ConfigError, match="table t2 is not held by L3"):
        registry.set_live("demo", 1)


def test_an_l3_folder_without_a_database_holds_nothing(config: PSConfig) -> None:
    """persistent_db.path made (an empty volume, before the first import) but holding no
    database: nothing to disagree with, not a 'no database' BackendError; the first
    record is written."""
    Path(config.persistent_db.path).mkdir()
    VersionRegistry(edited(config, hps_row_dtype="float16")).check_unrecorded("demo")
    registry = VersionRegistry(config)
    registry.begin(config.model("demo"), 2)
    assert [(v.version, v.state) for v in registry.versions("demo")] == [
        (1, "live"),
        (2, "loading"),
    ]


def test_only_what_the_node_holds_is_checked_at_the_first_record(config: PSConfig) -> None:
    """No L3 yet: nothing to disagree with. L3 holding some of the model's tables: one it
    does not hold is named, as is one it holds in another format (and only those); a model
    none of whose tables L3 holds (never imported) passes."""
    from hps.loading.imports import import_tables
    from hps.topology import topology

    VersionRegistry(edited(config, hps_row_dtype="float16")).check_unrecorded("demo")  # no L3
    import_tables(config, topology(config), sparse_sources(config)[:1])  # t0 only
    with pytest.raises(ConfigError, match="table t1 is not held by L3") as exc:
        VersionRegistry(edited(config, embedding_vecsize_per_table=[4, 6])).check_unrecorded("demo")
    assert "table t0" not in str(exc.value)
    with pytest.raises(ConfigError, match="table t0 is held") as exc:
        VersionRegistry(edited(config, hps_row_dtype="float16")).check_unrecorded("demo")
    assert "table t1 is held" not in str(exc.value) and "table t1 is not held" in str(exc.value)
    doc = config.model("demo").model_dump(mode="json")
    two = make_config(
        Path(config.persistent_db.path).parent,
        models=[doc, {**doc, "model": "other", "hps_row_dtype": "float16"}],
    )
    VersionRegistry(two).check_unrecorded("other")  # none of its tables in L3


def test_a_version_in_its_own_row_formats_and_dims_beside_version_1(
    config: PSConfig, tmp_path: Path
) -> None:
    """Version 2 in float16 / int8 rows of dimension 6 (given with the import, the ps.json
    untouched): each version's session serves its own rows, version 1's as float32."""
    from hps.build import build_session
    from hps.ctr.network import make_weights

    prepare_tables(config)
    v2 = []
    for name in ("t0", "t1"):
        write_sparse_model(tmp_path / "v2" / name, KEYS, rows(KEYS, 6) + 0.1)  # not float16's
        v2.append(str(tmp_path / "v2" / name))
    make_weights(tmp_path / "v2" / "dense.npz", num_dense=26, emb_width=12)
    entry = version_entry(config, "demo", sparse_files=v2, row_dtype=["float16", "int8"],
                          dims=[6], dense_file=str(tmp_path / "v2" / "dense.npz"))  # fmt: skip
    assert import_version(config, entry, 2) == {"demo.t0@2": 50, "demo.t1@2": 50}
    registry = VersionRegistry(config)
    assert [(t.row_dtype, t.dim) for t in registry.model_at("demo", 2).tables] == [
        ("float16", 6),
        ("int8", 6),
    ]
    assert l3_rows(config, 1, KEYS[:3]).dtype == np.float32

    def t0(version: int) -> np.ndarray:
        session = build_session(registry.config_at("demo", version), with_cache=False)
        try:
            return np.asarray(session.lookup(f"demo.t0{'' if version == 1 else '@2'}", KEYS[:3]))
        finally:
            session.close()

    np.testing.assert_array_equal(t0(1), rows(KEYS[:3], 4))
    want = (rows(KEYS[:3], 6) + 0.1).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(t0(2), want)
    assert not np.array_equal(want, rows(KEYS[:3], 6) + 0.1)  # float16 rows, not float32


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"row_dtype": ["float16"] * 3}, r"2 tables \(t0, t1\) but 3 row formats were given"),
        ({"row_dtype": ["float8"]}, "unknown row format 'float8': one of float32, float16, int8"),
        ({"dims": [0]}, "a table's dimension is a positive integer up to 65536, not 0"),
        ({"dims": [4_000_000_000_000]}, "up to 65536, not 4000000000000"),
        ({"dims": [4, 8, 8]}, r"2 tables \(t0, t1\) but 3 dimensions were given"),
    ],
)
def test_bad_row_formats_and_dims_are_refused(
    config: PSConfig, options: dict[str, list[object]], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        version_entry(config, "demo", **options)  # type: ignore[arg-type]


def test_the_sparse_files_and_dense_weights_must_take_the_version_s_dims(
    config: PSConfig, tmp_path: Path
) -> None:
    from hps.ctr.network import make_weights

    prepare_tables(config)
    make_weights(tmp_path / "ctr12.npz", num_dense=26, emb_width=12)  # dims 4 + 8, or 6 + 6
    make_weights(tmp_path / "ctr16.npz", num_dense=26, emb_width=16)
    entry = version_entry(config, "demo", sparse_files=tables(tmp_path / "v2", 7), dims=[6],
                          dense_file=str(tmp_path / "ctr12.npz"))  # fmt: skip
    with pytest.raises(SparseModelError, match="expected 50 rows x dim 6"):
        import_version(config, entry, 2)  # files of dims 4 and 8
    assert [v.version for v in VersionRegistry(config).versions("demo")] == [1]

    version_entry(config, "demo", dense_file=str(tmp_path / "ctr12.npz"))
    version_entry(config, "demo", dense_file=str(tmp_path / "ctr16.npz"), dims=[8])
    with pytest.raises(ConfigError, match=r"takes 12 embedding inputs beside its 26 dense "
                       r"features, but the tables' dimensions \[8, 8\] add up to 16"):  # fmt: skip
        version_entry(config, "demo", dense_file=str(tmp_path / "ctr12.npz"), dims=[8])
    with pytest.raises(ConfigError, match="not CTR weights"):
        version_entry(config, "demo", dims=[8])  # the ps.json's dense_file, for dims 4 and 8


def version_files(config: PSConfig, version: int) -> list[str]:
    """What the node's versions folder holds of ``version`` of demo (its copies, its
    import's marker)."""
    from hps.loading.imports import node_file
    from hps.versions.rollout import VERSIONS_DIR

    folder = node_file(Path(config.persistent_db.path), VERSIONS_DIR) / "demo"
    return sorted(
        str(p.relative_to(folder)) for p in folder.glob(f"{version}*") if p.is_file()
    ) + sorted(str(p.relative_to(folder)) for p in folder.glob(f"{version}/*"))


def test_a_retire_deletes_the_version_s_files_once_its_rows_are_dropped(
    config: PSConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its copied dense file and its import's marker go with its rows; a retire whose drop
    failed leaves them until the drop is done; rows kept in a shared L2 for another node
    keep them until those are dropped too."""
    from hps.storage.rocks_db import RocksDBStore
    from hps.versions import rollout

    for v in (2, 3):
        import_version(
            config, version_entry(config, "demo", sparse_files=tables(tmp_path / f"v{v}", v)), v
        )
    assert version_files(config, 2) == ["2.importing", "2/dense.npz"]
    holder = RocksDBStore(config.persistent_db.path)  # hps consume holds L3's writer lock
    try:
        with pytest.raises(BackendError, match="its rows could not be dropped"):
            retire(config, "demo", 2)
    finally:
        holder.close()
    assert version_files(config, 2) == ["2.importing", "2/dense.npz"]  # rows left: kept
    retire(config, "demo", 2)
    assert version_files(config, 2) == []
    assert version_files(config, 3) == ["3.importing", "3/dense.npz"]  # another version's

    drop = rollout.drop_versions
    monkeypatch.setattr(rollout, "drop_versions",
                        lambda *a: drop(*a) or {("demo", 3)})  # fmt: skip
    retire(config, "demo", 3)  # another node holds its rows in the shared L2
    assert VersionRegistry(config).get("demo", 3).shared_rows_left
    assert version_files(config, 3) == ["3.importing", "3/dense.npz"]


def test_a_retire_refuses_a_version_the_written_version_policy_names(
    config: PSConfig, tmp_path: Path
) -> None:
    """The activator of version 2 killed after it gave Triton the policy [1, 2] (Triton
    serves 2) and before it recorded 2 live: the record does not serve 2, the policy in
    hps serve's model repository does; the retire is refused, saying what to run."""
    from hps.loading.imports import repository_dir

    import_version(
        config, version_entry(config, "demo", sparse_files=tables(tmp_path / "v2", 7)), 2
    )
    repo = repository_dir(config)
    assert repo is not None
    for name, versions in (("demo", "1, 2"), ("demo_ctr", "1")):
        (repo / name).mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nparameters: [\n  {{ key: "hps_model", value: {{ string_value: '
            f'"demo" }} }}\n]\nversion_policy: {{ specific: {{ versions: [ {versions} ] }} }}\n'
        )
    assert VersionRegistry(config).served("demo") == [1]
    with pytest.raises(ConfigError) as exc:
        retire(config, "demo", 2)
    assert str(exc.value) == (
        "model 'demo' version 2 may be served by Triton: the version policy written for demo "
        "names it, though the record does not (an activation that did not finish); activate "
        "version 1 (the recorded live one) to put Triton back on the record, or 2 to finish "
        "that activation, before retiring it"
    )
    assert VersionRegistry(config).get("demo", 2).state == "ready"
    other = tmp_path / "other"  # another repository (hps admin --repository) names it not
    (other / "demo").mkdir(parents=True)
    (other / "demo" / "config.pbtxt").write_text(
        "version_policy: { specific: { versions: [ 1 ] } }\n"
    )
    from hps.versions.rollout import written_policy

    assert written_policy(config, "demo") == {"demo": [1, 2], "demo_ctr": [1]}
    assert written_policy(config, "demo", other) == {"demo": [1]}
    retire(config, "demo", 2, other)
    assert VersionRegistry(config).get("demo", 2).state == "retired"


def test_a_version_number_above_max_version_is_refused_before_anything_is_written(
    config: PSConfig, tmp_path: Path
) -> None:
    from hps.types import MAX_VERSION

    entry = version_entry(config, "demo", sparse_files=tables(tmp_path / "v2", 7))
    with pytest.raises(ConfigError, match="positive integers up to 2147483647, not 2147483648"):
        import_version(config, entry, MAX_VERSION + 1)
    assert [v.version for v in VersionRegistry(config).versions("demo")] == [1]
    assert version_files(config, MAX_VERSION + 1) == []
    assert not Path(config.persistent_db.path).exists()  # no L3 written


def leftovers(config: PSConfig, version: int) -> list[str]:
    """The marker and the folder of ``version`` of demo in the node's versions folder, as
    far as they exist (an empty folder too)."""
    from hps.versions.rollout import _marker

    folder = _marker(config, "demo", version).parent
    return sorted(n for n in (f"{version}.importing", str(version)) if (folder / n).exists())


def test_a_refused_import_leaves_no_files(config: PSConfig, tmp_path: Path) -> None:
    prepare_tables(config)
    paths = tables(tmp_path / "v2", seed=7)
    import_version(config, version_entry(config, "demo", sparse_files=paths), 2)
    retire(config, "demo", 2)
    assert leftovers(config, 2) == []
    with pytest.raises(ConfigError, match="version 2 exists"):
        import_version(config, version_entry(config, "demo", sparse_files=paths), 2)
    assert leftovers(config, 2) == []


def test_a_failed_import_leaves_no_files(config: PSConfig, tmp_path: Path) -> None:
    prepare_tables(config)
    paths = tables(tmp_path / "v2", seed=7)
    (Path(paths[0]) / "key").write_bytes(b"\0" * 3)  # not whole keys
    with pytest.raises(SparseModelError):
        import_version(config, version_entry(config, "demo", sparse_files=paths), 2)
    assert leftovers(config, 2) == []
    assert [v.version for v in VersionRegistry(config).versions("demo")] == [1]


def test_a_network_file_that_is_not_on_the_node_is_not_copied(
    config: PSConfig, tmp_path: Path
) -> None:
    """network_file is ignored (HugeCTR's network JSON): a HugeCTR ps.json naming one that
    is not on this node imports, its path kept as given; one that is there is copied."""
    prepare_tables(config)
    entry = version_entry(config, "demo", sparse_files=tables(tmp_path / "v2", seed=7))
    missing = entry.model_copy(update={"network_file": "/models/dcn/1/dcn.json"})
    import_version(config, missing, 2)
    assert VersionRegistry(config).model_at("demo", 2).network_file == "/models/dcn/1/dcn.json"
    (tmp_path / "net.json").write_text("{}")
    there = entry.model_copy(update={"network_file": str(tmp_path / "net.json")})
    import_version(config, there, 3)
    copied = Path(VersionRegistry(config).model_at("demo", 3).network_file)
    assert copied.parent.name == "3" and copied.read_text() == "{}"
