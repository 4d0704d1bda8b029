"""An activation whose retire of old rows fails is done, and says what is left (real
RocksDB files; Triton stood in for by a control that loads at once)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rocksdict as rd

from hps.config import PSConfig
from hps.io.sparse_model import write_sparse_model
from hps.storage.rocks_db import RocksDBStore
from hps.triton.activation import activate
from hps.triton.serving import prepare_tables
from hps.versions import VersionRegistry
from hps.versions.rollout import import_version, version_entry
from tests.helpers import make_config, rows

KEYS = np.arange(20, dtype=np.int64)


class Control:
    """Triton: every load succeeds at once, nothing stays loaded beyond what is served."""

    def load(self, name: str) -> None:
        pass

    def version_states(self, name: str) -> dict[int, str]:
        return {}


def sparse(folder: Path, seed: int) -> list[str]:
    for name, dim in (("t0", 4), ("t1", 8)):
        write_sparse_model(folder / name, KEYS, rows(KEYS, dim, seed))
    return [str(folder / "t0"), str(folder / "t1")]


@pytest.fixture
def config(tmp_path: Path) -> PSConfig:
    doc = make_config(tmp_path).model("demo").model_dump(mode="json")
    doc["sparse_files"] = sparse(tmp_path / "v1", 0)
    config = make_config(tmp_path, models=[doc])
    prepare_tables(config)
    for v in (2, 3):
        entry = version_entry(config, "demo", sparse_files=sparse(tmp_path / f"v{v}", v))
        import_version(config, entry, v)
    return config


def repository(tmp_path: Path) -> Path:
    model = tmp_path / "repository" / "demo"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text("")
    (model / "config.pbtxt").write_text('name: "demo"\n')
    return model.parent


def rows_of(config: PSConfig, table: str) -> int:
    """Rows L3 holds of ``table`` (a version 1 table dropped is emptied, not removed)."""
    path = config.persistent_db.path
    raw = rd.Options(raw_mode=True)
    names = rd.Rdict.list_cf(path, raw)
    if table not in names:
        return 0
    db = rd.Rdict(path, raw, column_families=dict.fromkeys(names, raw),
                  access_type=rd.AccessType.read_only())  # fmt: skip
    try:
        return sum(1 for _ in db.get_column_family(table).keys())  # noqa: SIM118 (an Rdict)
    finally:
        db.close()


def test_an_activation_whose_retire_fails_is_done_and_reports_the_rows_left(
    config: PSConfig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repo, control = repository(tmp_path), Control()
    holder = RocksDBStore(config.persistent_db.path)  # hps consume holds L3's writer lock
    try:
        done = activate(config, "demo", 3, control, repo)  # type: ignore[arg-type]
    finally:
        holder.close()
    registry = VersionRegistry(config)
    assert (done.live, done.retired, done.rows_left) == (3, [1], [1])
    assert done.problem is not None and "version 1 is retired but its rows" in done.problem
    assert "version 1 is retired but its rows could not be dropped" in caplog.text
    assert registry.live("demo") == 3 and registry.rows_left("demo") == [1]
    assert rows_of(config, "demo.t0") > 0

    done = activate(config, "demo", 2, control, repo)  # type: ignore[arg-type]
    assert (done.live, done.retired, done.rows_left, done.problem) == (2, [], [], None)
    assert VersionRegistry(config).rows_left("demo") == []
    assert rows_of(config, "demo.t0") == 0  # the next activation dropped them
