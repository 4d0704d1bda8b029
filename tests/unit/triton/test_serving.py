"""What a serving process does with a ps.json: paths, L2 choice, imports, L2 fill."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from hps.build import build_session
from hps.config import load_config
from hps.errors import ConfigError
from hps.io.sparse_model import write_sparse_model
from hps.loading.imports import sparse_sources
from hps.loading.loader import Loader
from hps.storage.rocks_db import RocksDBStore
from hps.tiers import Tiers
from hps.triton.serving import fill_l2, only_model, prepare_tables, serving_config
from tests.helpers import unique_name


def write_ps(tmp_path: Path, *, instances: int = 1, volatile: dict | None = None) -> Path:
    rng = np.random.default_rng(0)
    for name, rows in (("t0", 40), ("t1", 30)):
        keys = np.arange(rows, dtype=np.int64) * 3
        write_sparse_model(tmp_path / "tables" / name, keys, rng.random((rows, 4), np.float32))
    doc = {
        "models": [
            {
                "model": "m",
                "sparse_files": ["tables/t0", "tables/t1"],
                "embedding_table_names": ["t0", "t1"],
                "embedding_vecsize_per_table": [4, 4],
                "gpucache": False,
                "hps_instances": instances,
            }
        ],
        "volatile_db": volatile or {"type": "hash_map", "initial_cache_rate": 0.5},
        "persistent_db": {"type": "rocks_db", "path": "rocks"},
    }
    (tmp_path / "ps.json").write_text(json.dumps(doc))
    return tmp_path / "ps.json"


def test_relative_paths_resolve_against_the_base_dir(tmp_path: Path) -> None:
    path = write_ps(tmp_path)
    doc = json.loads(path.read_text())
    doc["models"][0]["hps_cache"] = {"warmup_keyset": "keys/{table}.keyset"}
    path.write_text(json.dumps(doc))
    config = serving_config(path, base_dir=tmp_path)
    assert config.models[0].hps_cache.warmup_keyset == str(tmp_path / "keys/{table}.keyset")
    assert config.models[0].hps_cache.frequency_file is None
    assert config.models[0].sparse_files == [
        str(tmp_path / "tables/t0"),
        str(tmp_path / "tables/t1"),
    ]
    assert config.persistent_db.path == str(tmp_path / "rocks")
    assert config.volatile_db.type == "hash_map"


def test_several_instances_default_to_the_shared_hash_map(tmp_path: Path, caplog) -> None:
    path = write_ps(tmp_path, instances=2, volatile={"initial_cache_rate": 1.0})
    assert serving_config(path, tmp_path).volatile_db.type == "multi_process_hash_map"
    assert load_config(path).volatile_db.type == "multi_process_hash_map"  # hps plan, import
    path = write_ps(tmp_path, instances=2, volatile={"type": "hash_map"})
    with caplog.at_level(logging.WARNING):
        assert serving_config(path, tmp_path).volatile_db.type == "hash_map"
    assert "each instance holds its own L2" in caplog.text
    path = write_ps(tmp_path, instances=1, volatile={"initial_cache_rate": 1.0})
    assert serving_config(path, tmp_path).volatile_db.type == "hash_map"


def l3_rows(config, table: str, keys) -> np.ndarray:
    store = RocksDBStore(config.persistent_db.path, mode="read_only")
    store.open_table(next(t for t in config.tables if t.name == table))
    try:
        values, found = store.fetch(table, np.asarray(keys, dtype=np.int64))
        assert found.all()
        return values
    finally:
        store.close()


def test_prepare_tables_imports_new_and_changed_tables_only(tmp_path: Path) -> None:
    config = serving_config(write_ps(tmp_path), tmp_path)
    assert prepare_tables(config) == {"m.t0": 40, "m.t1": 30}
    assert prepare_tables(config) == {}
    new = np.full((30, 4), 7.0, dtype=np.float32)
    write_sparse_model(tmp_path / "tables" / "t1", np.arange(30, dtype=np.int64) * 3, new)
    assert prepare_tables(config) == {"m.t1": 30}
    np.testing.assert_array_equal(l3_rows(config, "m.t1", [0, 87]), new[[0, 29]])


def test_prepare_tables_trusts_an_l3_imported_before(tmp_path: Path) -> None:
    config = serving_config(write_ps(tmp_path), tmp_path)
    tiers = Tiers.open(config, l2=False)
    tiers.open_tables(config.tables)
    loader = Loader(tiers, "skip")
    for source in sparse_sources(config):
        loader.load(source)  # e.g. an import by another tool: no record of it
    tiers.close()
    assert prepare_tables(config) == {}


def test_nothing_to_import_leaves_l3_to_its_writer(tmp_path: Path) -> None:
    config = serving_config(write_ps(tmp_path), tmp_path)
    prepare_tables(config)
    writer = RocksDBStore(config.persistent_db.path)  # e.g. `hps consume`, holding the lock
    try:
        assert prepare_tables(config) == {}
    finally:
        writer.close()


def test_fill_l2_per_initial_cache_rate(tmp_path: Path) -> None:
    config = only_model(serving_config(write_ps(tmp_path), tmp_path), "m")
    prepare_tables(config)
    session = build_session(config, with_cache=False, l3_mode="read_only")
    try:
        assert fill_l2(session, config, config.models[0]) == 20 + 15
        assert session.tiers.volatile is not None
        assert session.tiers.volatile.size("m.t0") == 20
        _, found = session.tiers.volatile.fetch("m.t1", np.array([0, 42, 45], dtype=np.int64))
        assert found.tolist() == [True, True, False]  # the file's first 15 rows: keys 0..42
    finally:
        session.close()


def test_shared_l2_is_filled_once_per_node(tmp_path: Path) -> None:
    volatile = {
        "shared_memory_name": unique_name("hps_unit"),
        "shared_memory_size": 1 << 26,
        "allocation_rate": 1 << 20,
    }
    path = write_ps(tmp_path, instances=2, volatile=volatile)
    config = serving_config(path, tmp_path)
    prepare_tables(config)
    first = build_session(config, with_cache=False, l3_mode="read_only")
    second = build_session(config, with_cache=False, l3_mode="read_only")
    try:
        assert fill_l2(first, config, config.models[0]) == 70
        assert fill_l2(second, config, config.models[0]) == 0
        assert second.tiers.volatile is not None and second.tiers.volatile.size("m.t1") == 30
    finally:
        first.close()
        second.close()


def test_config_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "ps.json"
    path.write_text('{"models": [{"model": "m"}]}')
    with pytest.raises(ConfigError, match=r"ps.json: models\[0\].embedding_vecsize_per_table"):
        serving_config(path)


def test_a_version_without_l3_is_not_refilled_from_files_changed_since_its_import(
    tmp_path: Path,
) -> None:
    """No L3, a shared-memory L2: a version's rows live only there and in its files; a
    retrain written over those files is refused at the refill, not served as the version."""
    from hps.versions import VersionRegistry
    from hps.versions.rollout import import_version, version_entry

    name = unique_name("hps_unit")
    volatile = {"type": "multi_process_hash_map", "shared_memory_name": name,
                "shared_memory_size": 1 << 26, "allocation_rate": 1 << 20}  # fmt: skip
    path = write_ps(tmp_path, volatile=volatile)
    doc = json.loads(path.read_text())
    doc["persistent_db"] = {"type": "disabled"}
    path.write_text(json.dumps(doc))
    config = serving_config(path, tmp_path)
    prepare_tables(config)
    latest = tmp_path / "latest"

    def retrain(seed: int) -> list[str]:
        rng = np.random.default_rng(seed)
        for t in ("t0", "t1"):
            keys = np.arange(40, dtype=np.int64)
            write_sparse_model(latest / t, keys, rng.random((40, 4), np.float32))
        return [str(latest / "t0"), str(latest / "t1")]

    import_version(config, version_entry(config, "m", sparse_files=retrain(7)), 2)
    import_version(config, version_entry(config, "m", sparse_files=retrain(9)), 3)  # same folder
    registry = VersionRegistry(config)
    try:
        for version, refused in ((3, False), (2, True)):
            served = only_model(registry.config_at("m", version), "m")
            session = build_session(served, with_cache=False)
            try:
                if refused:
                    with pytest.raises(ConfigError, match=r"m\.t0@2: its files .* changed since"):
                        fill_l2(session, served, served.model("m"))
                else:
                    assert fill_l2(session, served, served.model("m")) == 80  # its own files
            finally:
                session.close()
        for f in latest.glob("*/*"):  # copied, or touched: another stamp, the same content
            os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
        served = only_model(registry.config_at("m", 3), "m")
        session = build_session(served, with_cache=False)
        try:
            assert fill_l2(session, served, served.model("m")) == 80
        finally:
            session.close()
    finally:
        for p in Path("/dev/shm").glob(name + "*"):
            p.unlink()


@pytest.mark.parametrize(
    "volatile", [{"initial_cache_rate": 1.0}, {"type": "multi_process_hash_map"}]
)
def test_a_shared_l2_without_an_entry_for_each_table_is_not_served(
    tmp_path: Path, volatile: dict
) -> None:
    """257 tables exceed the segment's 256 table entries: refused as the ps.json is read
    for serving (hps serve, before Triton starts), naming what each model needs, rather
    than by the segment in a Triton instance's start-up. Kept versions are not counted."""
    path = write_ps(tmp_path, instances=2, volatile=volatile)
    doc = json.loads(path.read_text())
    entry = dict(doc["models"][0])
    doc["models"][0].update(embedding_vecsize_per_table=[4] * 257,
                            embedding_table_names=[f"t{i}" for i in range(257)],
                            sparse_files=[f"tables/t{i}" for i in range(257)])  # fmt: skip
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"the models need 257 \(m: 257 tables\)"):
        serving_config(path, tmp_path)
    doc["models"][0] = entry
    doc["models"][0]["hps_keep_versions"] = 200  # versions beyond the entries fail to load
    path.write_text(json.dumps(doc))
    assert serving_config(path, tmp_path).volatile_db.type == "multi_process_hash_map"


@pytest.mark.parametrize("setting", ["warmup_keyset", "frequency_file"])
def test_a_warm_up_file_that_is_not_there_stops_the_start(tmp_path: Path, setting: str) -> None:
    """Checked per table after ``{table}`` is replaced, before any instance loads it; a
    model without L1 never reads it."""
    path = write_ps(tmp_path)
    doc = json.loads(path.read_text())
    doc["models"][0]["hps_cache"] = {setting: "warm/{model}.{table}"}
    path.write_text(json.dumps(doc))
    serving_config(path, base_dir=tmp_path)  # gpucache: false
    doc["models"][0]["gpucache"] = True
    path.write_text(json.dumps(doc))
    (tmp_path / "warm").mkdir()
    (tmp_path / "warm" / "m.t0").write_bytes(b"")
    with pytest.raises(ConfigError, match=rf"model m: hps_cache.{setting} .*warm/m.t1: no such"):
        serving_config(path, base_dir=tmp_path)
    (tmp_path / "warm" / "m.t1").mkdir()
    with pytest.raises(ConfigError, match=r"warm/m.t1: is a folder, not a file"):
        serving_config(path, base_dir=tmp_path)
    (tmp_path / "warm" / "m.t1").rmdir()
    (tmp_path / "warm" / "m.t1").write_bytes(b"")
    assert serving_config(path, base_dir=tmp_path).models[0].hps_cache.model_dump()[setting]
