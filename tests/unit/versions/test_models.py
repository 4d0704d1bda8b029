"""Models added and removed at runtime: the record, the config as served, purging."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.config import ModelConfig, PSConfig
from hps.errors import ConfigError, UnknownTableError
from hps.io.sparse_model import write_sparse_model
from hps.tiers import Tiers
from hps.versions import VersionRegistry
from hps.versions.models import add_model, mark_removed, purge, served_config
from tests.helpers import make_config

KEYS = np.arange(20, dtype=np.int64)


@pytest.fixture
def config(tmp_path: Path) -> PSConfig:
    return make_config(tmp_path)


def entry(tmp_path: Path, name: str = "extra", value: float = 3.0) -> ModelConfig:
    write_sparse_model(tmp_path / name / "t", KEYS, np.full((KEYS.size, 2), value, np.float32))
    return ModelConfig.model_validate({
        "model": name, "sparse_files": [str(tmp_path / name / "t")],
        "embedding_table_names": ["t"], "embedding_vecsize_per_table": [2],
    })  # fmt: skip


def l3_count(config: PSConfig, spec_model: ModelConfig) -> int:
    spec = spec_model.tables[0]
    tiers = Tiers.open(config, l3_mode="read_write", l2=False)
    try:
        assert tiers.persistent is not None
        tiers.open_tables([spec])
        return tiers.persistent.size(spec.name)
    finally:
        tiers.close()


def test_a_model_added_at_runtime_is_served_beside_the_ps_json_ones(
    config: PSConfig, tmp_path: Path
) -> None:
    assert served_config(config) is config  # nothing recorded: the ps.json as it is
    assert add_model(config, entry(tmp_path)) == 1
    served = served_config(config)
    assert [m.model for m in served.models] == ["demo", "extra"]
    extra = served.model("extra")
    assert extra.version == 1 and VersionRegistry(config).live("extra") == 1
    assert l3_count(config, extra) == KEYS.size
    with pytest.raises(ConfigError, match="served already"):
        add_model(config, entry(tmp_path))
    with pytest.raises(ConfigError, match="served already"):
        add_model(config, entry(tmp_path, "demo"))
    np.savez(tmp_path / "d.npz", w=np.ones(3, np.float32))
    ctr = entry(tmp_path, "extra2").model_copy(update={"dense_file": str(tmp_path / "d.npz")})
    add_model(config, ctr)  # served as extra2 and extra2_ctr
    with pytest.raises(ConfigError, match=r"served as \['extra2_ctr'\], a Triton model"):
        add_model(config, entry(tmp_path, "extra2_ctr"))


def test_removed_models_are_not_served_and_keep_their_rows_until_purged(
    config: PSConfig, tmp_path: Path
) -> None:
    add_model(config, entry(tmp_path))
    mark_removed(config, "extra")
    assert [m.model for m in served_config(config).models] == ["demo"]
    with pytest.raises(UnknownTableError, match="removed"):
        VersionRegistry(config).live("extra")
    extra_v1 = entry(tmp_path).at_version(1)
    assert l3_count(config, extra_v1) == KEYS.size  # kept
    with pytest.raises(ConfigError, match="rows are kept"):
        add_model(config, entry(tmp_path))
    with pytest.raises(ConfigError, match="last one this node serves"):
        mark_removed(config, "demo")
    assert purge(config, "extra") == [1]
    assert l3_count(config, extra_v1) == 0
    # the name can come back; its version numbers go on
    assert add_model(config, entry(tmp_path, value=5.0)) == 2
    assert served_config(config).model("extra").version == 2


def test_a_ps_json_model_can_be_removed_and_purged(config: PSConfig, tmp_path: Path) -> None:
    add_model(config, entry(tmp_path))
    mark_removed(config, "demo")  # the ps.json still names it; the record wins
    assert [m.model for m in served_config(config).models] == ["extra"]
    with pytest.raises(ConfigError, match="is served"):
        purge(config, "extra")
    assert purge(config, "demo") == [1]


def test_a_failed_add_leaves_no_record(config: PSConfig, tmp_path: Path) -> None:
    bad = entry(tmp_path)
    (Path(bad.sparse_files[0]) / "emb_vector").write_bytes(b"\0" * 3)
    with pytest.raises(Exception, match="emb_vector"):
        add_model(config, bad)
    assert served_config(config).models == config.models
    assert VersionRegistry(config).runtime_models() == []


def test_a_purge_drops_the_rows_a_failed_retire_left(config: PSConfig, tmp_path: Path) -> None:
    add_model(config, entry(tmp_path))
    with VersionRegistry(config).editing() as doc:  # as a retire whose drop failed leaves it
        doc["extra"]["versions"]["1"].update(state="retired", rows_left=True)  # type: ignore[index]
    mark_removed(config, "extra")
    assert purge(config, "extra") == [1]
    assert l3_count(config, entry(tmp_path)) == 0
    assert VersionRegistry(config).rows_left("extra") == []


DIES_IN_ADD = """
import os, sys
import hps.versions.rollout as rollout
from hps.config import ModelConfig, PSConfig
from hps.versions.models import add_model

config = PSConfig.model_validate_json(sys.argv[1])
entry = ModelConfig.model_validate_json(sys.argv[2])
real = rollout.import_tables

def dying(*args, **kw):  # the process is killed once the first table is written
    real(*args, **kw)
    os._exit(9)

rollout.import_tables = dying
add_model(config, entry)
"""


def test_a_model_whose_add_died_can_be_added_again(config: PSConfig, tmp_path: Path) -> None:
    """A control plane killed while it imported a new model's first version: the name is
    neither served nor stuck; adding it again drops what was written and serves it."""
    import subprocess
    import sys

    extra = entry(tmp_path)
    died = subprocess.run(
        [sys.executable, "-c", DIES_IN_ADD, config.model_dump_json(), extra.model_dump_json()],
        cwd=Path(__file__).resolve().parents[3],
    )
    assert died.returncode == 9
    registry = VersionRegistry(config)
    assert [(v.version, v.state) for v in registry.versions("extra")] == [(1, "loading")]
    assert [m.model for m in served_config(config).models] == ["demo"]
    assert add_model(config, entry(tmp_path, "other")) == 1  # other adds are not blocked
    assert add_model(config, entry(tmp_path, value=5.0)) == 2  # numbers are never reused
    assert [(v.version, v.state) for v in registry.versions("extra")] == [
        (1, "retired"),
        (2, "live"),
    ]
    assert l3_count(config, extra) == 0  # what the add that died wrote
    assert l3_count(config, served_config(config).model("extra")) == KEYS.size
