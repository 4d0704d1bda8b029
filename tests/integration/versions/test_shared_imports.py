"""Nodes that share a Redis L2 importing the same version number: its rows in that L2 are
one import's, so a node whose files differ from those another node imported that version
from is refused before it writes anything. Real Redis, real RocksDB."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hps.config import PSConfig, parse_config
from hps.errors import ConfigError
from hps.io.sparse_model import write_sparse_model
from hps.storage.redis_cluster import RedisStore
from hps.storage.rocks_db import RocksDBStore
from hps.tiers.node_records import NodeRecords
from hps.updates.shared_record import RecordPublisher
from hps.versions import VersionRegistry
from hps.versions.node_record import node_name
from hps.versions.rollout import VERSIONS_DIR, import_version, version_entry
from tests.fixtures.kafka import update_doc
from tests.helpers import rows

pytestmark = pytest.mark.integration

KEYS = np.arange(60, dtype=np.int64)


def node_config(tmp_path: Path, name: str, doc: dict[str, Any]) -> PSConfig:
    """A serving node's ps.json: ``doc`` with an L3 of its own."""
    l3 = {"type": "rocks_db", "path": str(tmp_path / name / "l3")}
    (tmp_path / name).mkdir(exist_ok=True)
    return parse_config({**doc, "persistent_db": l3}, str(tmp_path / name / "ps.json"))


def write_tables(folder: Path, seed: int) -> list[str]:
    """The model's tables t0 (4) and t1 (8) as sparse-model folders, in table order."""
    for table, dim in (("t0", 4), ("t1", 8)):
        write_sparse_model(folder / table, KEYS, rows(KEYS, dim, seed=seed))
    return [str(folder / "t0"), str(folder / "t1")]


def publish(config: PSConfig) -> None:
    publisher = RecordPublisher(config)
    try:
        publisher.publish()
    finally:
        publisher.close()


def l3_tables(config: PSConfig) -> list[str]:
    l3 = RocksDBStore(str(config.persistent_db.path), mode="read_only")
    try:
        return sorted(l3.column_families)
    finally:
        l3.close()


def test_an_import_of_a_version_another_node_imported_from_other_files_is_refused(
    tmp_path: Path, redis_address: str
) -> None:
    doc = update_doc(tmp_path, "127.0.0.1:1", volatile={"type": "redis", "address": redis_address})
    a, b = node_config(tmp_path, "a", doc), node_config(tmp_path, "b", doc)
    model = a.models[0].model
    files_a, files_b = write_tables(tmp_path / "a5", 3), write_tables(tmp_path / "b5", 4)
    import_version(a, version_entry(a, model, sparse_files=files_a), 5)
    publish(a)  # a holds version 5 whole
    import_version(b, version_entry(b, model, sparse_files=files_b), 6)  # another number: taken

    with pytest.raises(ConfigError) as refused:
        import_version(b, version_entry(b, model, sparse_files=files_b), 5)
    message = str(refused.value)
    assert f"model {model!r} version 5" in message and node_name(VersionRegistry(a)) in message
    assert "import the same files or another version number" in message
    assert 5 not in {v.version for v in VersionRegistry(b).versions(model)}
    assert not [t for t in l3_tables(b) if t.endswith("@5")]
    assert not (tmp_path / "b" / f"l3{VERSIONS_DIR}" / model / "5.importing").exists()
    store = RedisStore.from_config(a.volatile_db)
    try:
        spec = a.models[0].at_version(5).tables[1]
        store.open_table(spec)
        values, found = store.fetch(spec.name, KEYS)
        assert found.all() and np.array_equal(np.asarray(values), rows(KEYS, 8, seed=3))
    finally:
        store.close()

    shutil.copytree(tmp_path / "a5", tmp_path / "copy")  # the same content elsewhere: taken
    copies = [str(tmp_path / "copy" / "t0"), str(tmp_path / "copy" / "t1")]
    import_version(b, version_entry(b, model, sparse_files=copies), 5)
    fingerprint = VersionRegistry(b).get(model, 5).fingerprint
    assert fingerprint and fingerprint == VersionRegistry(a).get(model, 5).fingerprint


def test_a_record_without_fingerprints_refuses_nothing(tmp_path: Path, redis_address: str) -> None:
    """A node of an older release publishes no fingerprint: its import is of unknown files,
    and another node's import of the same number goes on (as before)."""
    doc = update_doc(tmp_path, "127.0.0.1:1", volatile={"type": "redis", "address": redis_address})
    a, b = node_config(tmp_path, "a", doc), node_config(tmp_path, "b", doc)
    model = a.models[0].model
    import_version(a, version_entry(a, model, sparse_files=write_tables(tmp_path / "a5", 3)), 5)
    publish(a)
    records = NodeRecords(a.volatile_db)
    try:
        field = node_name(VersionRegistry(a))
        raw = records.get(field)
        assert raw is not None
        old = json.loads(raw)
        for v in old["models"][model]["versions"]:
            v.pop("fingerprint", None)
        records.put(field, json.dumps(old))
    finally:
        records.close()
    import_version(b, version_entry(b, model, sparse_files=write_tables(tmp_path / "b5", 4)), 5)
    assert VersionRegistry(b).get(model, 5).state == "ready"
