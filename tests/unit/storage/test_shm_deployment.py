"""Whose ``multi_process_hash_map`` segment it is: every deployment on a host gets its own
(named after its L3 path unless the ps.json names one), and a segment refuses a store of
another deployment that was given its name by hand."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hps.config import PSConfig, VolatileDBConfig, parse_config
from hps.config.databases import SHM_NAME_MAX, shared_memory_name_for
from hps.errors import ConfigError
from hps.storage import open_store
from hps.storage.multi_process_hash_map import SharedHashMapStore
from hps.triton.serving import serving_config
from hps.types import TableSpec
from tests.helpers import rows, unique_name

MiB = 1024 * 1024
SPEC = TableSpec("demo", "t0", 4)


def _doc(l3: str, **volatile: Any) -> dict[str, Any]:
    return {
        "models": [
            {
                "model": "demo",
                "embedding_table_names": ["t0"],
                "embedding_vecsize_per_table": [4],
                "maxnum_catfeature_query_per_table_per_sample": [2],
                "default_value_for_each_table": [0.0],
                "max_batch_size": 16,
                "gpucache": False,
            }
        ],
        "volatile_db": {
            "type": "multi_process_hash_map",
            "shared_memory_size": 8 * MiB,
            **volatile,
        },  # fmt: skip
        "persistent_db": {"type": "rocks_db", "path": l3},
    }


@pytest.fixture
def opened() -> Iterator[list[SharedHashMapStore]]:
    """Stores to close after the test, which then checks their segments are gone."""
    stores: list[SharedHashMapStore] = []
    yield stores
    paths = {s.path for s in stores}
    for s in stores:
        s.close()
    for path in paths:
        for suffix in ("", ".lock", ".users", ".turn"):
            if os.path.exists(path + suffix):
                os.unlink(path + suffix)
                pytest.fail(f"{path + suffix} was left behind")


def test_two_deployments_on_one_host_get_segments_of_their_own(
    tmp_path: Path, opened: list[SharedHashMapStore]
) -> None:
    """Two ps.json files with their own L3 folders and no shared_memory_name: each its own
    segment, so one never serves the other's rows (it used to be one default name)."""
    a = parse_config(_doc(str(tmp_path / "a" / "rocksdb")))
    b = parse_config(_doc(str(tmp_path / "b" / "rocksdb")))
    names = [c.volatile_db.shared_memory_name for c in (a, b)]
    assert names[0] != names[1]
    assert names == [shared_memory_name_for(str(tmp_path / d / "rocksdb")) for d in "ab"]
    stores = []
    for config in (a, b):
        store = open_store(config.volatile_db)
        assert isinstance(store, SharedHashMapStore)
        opened.append(store)
        store.open_table(SPEC)
        stores.append(store)
    keys = np.arange(8, dtype=np.int64)
    stores[0].insert(SPEC.name, keys, rows(keys, 4))
    assert not stores[1].fetch(SPEC.name, keys)[1].any()
    assert stores[0].path != stores[1].path


def test_the_default_follows_the_l3_path_as_resolved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative L3 path: resolved against the caller's folder when read, against the
    served base folder by serving_config (as L3 itself is); a configured name is kept."""
    monkeypatch.chdir(tmp_path)
    assert parse_config(_doc("rocksdb")).volatile_db.shared_memory_name == (
        shared_memory_name_for(str(tmp_path / "rocksdb"))
    )
    ps = tmp_path / "ps.json"
    ps.write_text(json.dumps(_doc("rocksdb")))
    served = serving_config(ps, tmp_path / "base")
    assert served.persistent_db.path == str(tmp_path / "base" / "rocksdb")
    assert served.volatile_db.shared_memory_name == shared_memory_name_for(
        served.persistent_db.path
    )
    assert served.volatile_db.deployment == served.persistent_db.path
    ps.write_text(json.dumps(_doc("rocksdb", shared_memory_name="mine")))
    assert serving_config(ps, tmp_path / "base").volatile_db.shared_memory_name == "mine"
    # a volatile_db on its own: the default L3 path's name, and no deployment to check
    alone = VolatileDBConfig(type="multi_process_hash_map")
    assert alone.shared_memory_name == shared_memory_name_for("/tmp/rocksdb")
    assert alone.deployment == ""
    assert PSConfig.model_validate(_doc("/x/rocksdb")).volatile_db.deployment == "/x/rocksdb"


def test_a_store_of_another_deployment_is_refused(
    tmp_path: Path, opened: list[SharedHashMapStore]
) -> None:
    """One name given by hand to two deployments: the second is refused, naming both L3
    folders; the first one's processes, and a store that says no deployment, still open."""
    name = unique_name("hps_test_shm")
    a, b = (
        parse_config(_doc(str(tmp_path / d / "rocksdb"), shared_memory_name=name)).volatile_db
        for d in "ab"
    )
    assert a.shared_memory_name == b.shared_memory_name == name

    def store(cfg: VolatileDBConfig | None) -> SharedHashMapStore:
        deployment = None if cfg is None else cfg.deployment
        s = SharedHashMapStore(name, 8 * MiB, directory=str(tmp_path), deployment=deployment)
        opened.append(s)
        return s

    first = store(a)
    with pytest.raises(ConfigError, match="two deployments must not share") as err:
        store(b)
    assert str(tmp_path / "a" / "rocksdb") in str(err.value)
    assert str(tmp_path / "b" / "rocksdb") in str(err.value)
    assert first.stats()["attached"] == 1  # the refused store left no trace
    store(a)
    store(None)
    assert first.stats()["attached"] == 3


def test_a_segment_without_a_record_takes_the_first_deployment(
    tmp_path: Path, opened: list[SharedHashMapStore]
) -> None:
    """A segment made by a store that named no deployment (or by an older HPS) is claimed
    by the first store that names one."""
    name = unique_name("hps_test_shm")
    opened.append(SharedHashMapStore(name, 8 * MiB, directory=str(tmp_path)))
    opened.append(SharedHashMapStore(name, 8 * MiB, directory=str(tmp_path), deployment="/a"))
    with pytest.raises(ConfigError, match="'/a'"):
        SharedHashMapStore(name, 8 * MiB, directory=str(tmp_path), deployment="/b")


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("a" * (SHM_NAME_MAX + 1), "characters long"),
        ("other.lock", "lock files"),
        ("a b", "letters, digits"),
    ],  # fmt: skip
)
def test_names_that_cannot_be_a_segment_are_config_errors(
    tmp_path: Path, name: str, problem: str
) -> None:
    with pytest.raises(ConfigError, match=f"shared_memory_name.*{problem}"):
        SharedHashMapStore(name, 8 * MiB, directory=str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_a_name_too_long_for_a_file_is_refused_when_the_config_is_read() -> None:
    with pytest.raises(ConfigError, match=r"volatile_db\.shared_memory_name: .*at most 200"):
        parse_config(_doc("/tmp/l3", shared_memory_name="a" * 300))
    assert parse_config(_doc("/tmp/l3", shared_memory_name="a" * SHM_NAME_MAX))
