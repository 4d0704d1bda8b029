"""Importing a version beside the live one, and retiring one (real RocksDB files)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.config import PSConfig
from hps.errors import ConfigError, SparseModelError
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
