"""A model added at runtime whose Triton load fails (Triton unreachable, a load refused) is
undone whole: recorded removed and purged, its Triton folders and version files deleted,
and the same entry can be added again (real RocksDB files; Triton stood in for by
controls). Serving through a real `hps serve` is tests/integration/triton/."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hps.config import ModelConfig, PSConfig
from hps.errors import BackendUnavailable, RequestError
from hps.io.sparse_model import write_sparse_model
from hps.loading.imports import node_file
from hps.tiers import Tiers
from hps.topology import topology
from hps.triton import models as triton_models
from hps.triton.models import add_and_serve
from hps.triton.repository import prepare_repository
from hps.versions import VersionRegistry
from hps.versions.models import served_config
from hps.versions.rollout import VERSIONS_DIR
from tests.helpers import make_config

KEYS = np.arange(20, dtype=np.int64)
DOWN = "cannot reach Triton at http://127.0.0.1:1: ConnectionRefusedError"


class Down:
    """Triton unreachable: every call raises as ModelControl's do."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def load(self, name: str) -> None:
        self.calls.append(f"load {name}")
        raise BackendUnavailable(DOWN)

    def unload(self, name: str) -> None:
        self.calls.append(f"unload {name}")
        raise BackendUnavailable(DOWN)

    def states(self) -> dict[str, str]:
        raise BackendUnavailable(DOWN)


class Up:
    """Triton reachable: loads at once, except the models named in ``refused``."""

    def __init__(self, refused: tuple[str, ...] = ()) -> None:
        self.refused = refused
        self.ready: set[str] = set()

    def load(self, name: str) -> None:
        if name in self.refused:
            raise RequestError(f"Triton answered 400 to /v2/repository/models/{name}/load")
        self.ready.add(name)

    def unload(self, name: str) -> None:
        if name not in self.ready:
            raise RequestError(f"Triton answered 400 to /v2/repository/models/{name}/unload")
        self.ready.discard(name)

    def states(self) -> dict[str, str]:
        return dict.fromkeys(self.ready, "READY")


@pytest.fixture
def config(tmp_path: Path) -> PSConfig:
    return make_config(tmp_path)


@pytest.fixture
def repo(config: PSConfig, tmp_path: Path) -> Path:
    """The repository `hps serve` wrote (the ps.json's model), parameters to take."""
    repository = tmp_path / "repository"
    prepare_repository(config, repository, metrics_interval_s=0.0)
    return repository


def entry(tmp_path: Path, value: float = 7.0, **update: Any) -> ModelConfig:
    write_sparse_model(tmp_path / "extra" / "t", KEYS, np.full((KEYS.size, 2), value, np.float32))
    return ModelConfig.model_validate({
        "model": "extra", "sparse_files": [str(tmp_path / "extra" / "t")],
        "embedding_table_names": ["t"], "embedding_vecsize_per_table": [2], **update,
    })  # fmt: skip


def l3_rows(config: PSConfig, model: ModelConfig) -> int:
    tiers = Tiers.open(config, l3_mode="read_write", l2=False)
    try:
        assert tiers.persistent is not None
        tiers.open_tables(model.tables)
        return sum(tiers.persistent.size(spec.name) for spec in model.tables)
    finally:
        tiers.close()


def versions_dir(config: PSConfig) -> Path:
    state = topology(config).state_dir
    assert state is not None
    return node_file(state, VERSIONS_DIR)


def assert_undone(config: PSConfig, repo: Path, added: ModelConfig) -> None:
    """Nothing of ``added`` (its version 1) served, in Triton's repository or in a tier."""
    assert [m.model for m in served_config(config).models] == ["demo"]
    registry = VersionRegistry(config)
    assert registry.removed("extra")  # recorded purged, as a DELETE ?purge=true leaves it
    assert [(v.version, v.state, v.rows_left) for v in registry.versions("extra")] == [
        (1, "retired", False)
    ]
    assert sorted(p.name for p in repo.iterdir()) == ["demo"]  # its folders deleted
    assert not (versions_dir(config) / "extra").exists()  # 1.importing and its files
    assert l3_rows(config, added.at_version(1)) == 0


def test_an_add_while_triton_is_unreachable_is_undone_and_can_be_submitted_again(
    config: PSConfig, repo: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    extra, down = entry(tmp_path), Down()
    with caplog.at_level(logging.WARNING), pytest.raises(BackendUnavailable) as failed:
        add_and_serve(config, extra, down, repo)  # type: ignore[arg-type]
    assert str(failed.value) == DOWN  # the load's error, not the cleanup's
    assert down.calls == ["load extra", "unload extra"]
    assert_undone(config, repo, extra)
    unloads = [r for r in caplog.records if "not unloaded" in r.getMessage()]
    assert [r.levelno for r in unloads] == [logging.WARNING]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]

    # Triton back: the same entry is added (its version numbers go on) and served
    up = Up()
    assert add_and_serve(config, entry(tmp_path, 9.0), up, repo) == (2, ["extra"])  # type: ignore[arg-type]
    assert up.ready == {"extra"}
    assert (repo / "extra" / "config.pbtxt").is_file()
    served = served_config(config).model("extra")
    assert served.version == 2 and l3_rows(config, served) == KEYS.size


def test_a_ctr_model_whose_second_load_is_refused_is_unloaded_and_undone(
    config: PSConfig, repo: Path, tmp_path: Path
) -> None:
    np.savez(tmp_path / "d.npz", w=np.ones(3, np.float32))
    extra = entry(tmp_path, dense_file=str(tmp_path / "d.npz"))  # served as extra, extra_ctr
    up = Up(refused=("extra_ctr",))
    with pytest.raises(RequestError, match="extra_ctr/load"):
        add_and_serve(config, extra, up, repo)  # type: ignore[arg-type]
    assert up.ready == set()  # the one that loaded is unloaded
    assert_undone(config, repo, extra)  # its dense file's copy deleted too


def test_a_cleanup_step_that_fails_does_not_stop_the_others_nor_hide_the_error(
    config: PSConfig,
    repo: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def no_purge(config: PSConfig, model: str) -> list[int]:
        raise BackendUnavailable("L3 held by hps consume")

    monkeypatch.setattr(triton_models, "purge", no_purge)
    with pytest.raises(BackendUnavailable, match="cannot reach Triton"):
        add_and_serve(config, entry(tmp_path), Down(), repo)  # type: ignore[arg-type]
    assert "rows could not be dropped (L3 held by hps consume)" in caplog.text
    assert sorted(p.name for p in repo.iterdir()) == ["demo"]
    assert not (versions_dir(config) / "extra").exists()
    assert VersionRegistry(config).removed("extra")  # a DELETE ?purge=true drops its rows


def test_a_removal_whose_unload_failed_is_finished_by_the_next(
    config: PSConfig, repo: Path, tmp_path: Path
) -> None:
    """Triton unreachable at a removal: recorded removed, its folder left (it may still be
    served); the next removal (DELETE again) unloads it before anything else."""
    up = Up()
    add_and_serve(config, entry(tmp_path), up, repo)  # type: ignore[arg-type]
    with pytest.raises(BackendUnavailable):
        triton_models.remove(config, "extra", Down(), repo, purge_rows=True)  # type: ignore[arg-type]
    assert VersionRegistry(config).removed("extra") and up.ready == {"extra"}
    assert triton_models.left_loaded(repo, "extra") == ["extra"]
    triton_models.unload(up, repo, ["extra"])  # type: ignore[arg-type]
    assert up.ready == set() and triton_models.left_loaded(repo, "extra") == []
