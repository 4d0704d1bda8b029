"""An activation whose retire of old rows fails is done, and says what is left; one whose
load fails leaves Triton serving what it served (real RocksDB files; Triton stood in for
by a control that loads at once, serving what the folder's version policy names)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import rocksdict as rd

from hps.config import PSConfig
from hps.errors import BackendError, ConfigError, RequestError
from hps.io.sparse_model import write_sparse_model
from hps.loading.imports import repository_dir
from hps.storage.rocks_db import RocksDBStore
from hps.triton.activation import activate
from hps.triton.serving import prepare_tables
from hps.versions import VersionRegistry
from hps.versions.rollout import import_version, retire, version_entry
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
    # 1 was live before 3: kept for rollback; 2 (never live) is retired
    assert (done.live, done.served, done.retired, done.rows_left) == (3, [1, 3], [2], [2])
    assert done.problem is not None and "version 2 is retired but its rows" in done.problem
    assert "version 2 is retired but its rows could not be dropped" in caplog.text
    assert registry.live("demo") == 3 and registry.rows_left("demo") == [2]
    assert rows_of(config, "demo.t0@2") > 0

    done = activate(config, "demo", 1, control, repo)  # type: ignore[arg-type]
    assert (done.live, done.retired, done.rows_left, done.problem) == (1, [], [], None)
    assert VersionRegistry(config).rows_left("demo") == []
    assert rows_of(config, "demo.t0@2") == 0  # the next activation dropped them


class Triton:
    """Triton: a load serves the versions the folder's version policy names, unless it is
    one to fail (``failing``: model name -> which of its loads fail, 1 the first)."""

    def __init__(self, repository: Path, failing: dict[str, set[int]]) -> None:
        self.repository = repository
        self.failing = failing
        self.serving = {name: [1] for name in ("demo", "demo_ctr")}
        self.loads: list[tuple[str, list[int]]] = []

    def load(self, name: str) -> None:
        policy = policy_of(self.repository, name)
        self.loads.append((name, policy))
        if sum(n == name for n, _ in self.loads) in self.failing.get(name, set()):
            raise RequestError(f"Triton answered 400 to /v2/repository/models/{name}/load: "
                               f"load failed for model '{name}'")  # fmt: skip
        self.serving[name] = policy

    def version_states(self, name: str) -> dict[int, str]:
        return dict.fromkeys(self.serving[name], "READY")


def policy_of(repository: Path, name: str) -> list[int]:
    text = (repository / name / "config.pbtxt").read_text()
    found = re.search(r"versions: \[([^\]]*)\]", text)
    assert found is not None, text
    return [int(v) for v in found.group(1).split(",")]


@pytest.fixture
def ctr(tmp_path: Path) -> tuple[PSConfig, Path]:
    """A CTR model (``demo`` and ``demo_ctr``) with version 2 imported, version 1 live; its
    repository where ``hps serve`` writes it."""
    from hps.ctr.network import make_weights

    make_weights(tmp_path / "dense.npz", num_dense=26, emb_width=12)
    doc = make_config(tmp_path).model("demo").model_dump(mode="json")
    doc.update(sparse_files=sparse(tmp_path / "v1", 0), dense_file=str(tmp_path / "dense.npz"))
    config = make_config(tmp_path, models=[doc])
    prepare_tables(config)
    entry = version_entry(config, "demo", sparse_files=sparse(tmp_path / "v2", 2))
    import_version(config, entry, 2)
    repo = repository_dir(config)
    assert repo is not None
    for name in ("demo", "demo_ctr"):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text("")
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nversion_policy: {{ specific: {{ versions: [ 1 ] }} }}\n'
        )
    return config, repo


def test_a_failed_load_of_the_ctr_model_reloads_the_embedding_model_with_its_old_policy(
    ctr: tuple[PSConfig, Path],
) -> None:
    """demo loads version 2, demo_ctr fails to: demo is loaded again with its old policy,
    so Triton serves version 1 of both, as the record says."""
    config, repo = ctr
    triton = Triton(repo, {"demo_ctr": {1}})
    with pytest.raises(RequestError, match="load failed for model 'demo_ctr'"):
        activate(config, "demo", 2, triton, repo)  # type: ignore[arg-type]
    assert triton.serving == {"demo": [1], "demo_ctr": [1]}
    assert triton.loads[-1] == ("demo", [1])  # the undo
    assert policy_of(repo, "demo") == policy_of(repo, "demo_ctr") == [1]
    registry = VersionRegistry(config)
    assert registry.live("demo") == 1 and registry.get("demo", 2).state == "ready"
    retire(config, "demo", 2)  # nothing serves it: it can go


def test_an_undo_that_fails_says_which_model_serves_which_versions(
    ctr: tuple[PSConfig, Path],
) -> None:
    """demo's reload with its old policy fails too: the error says demo serves versions 1
    and 2 (unversioned requests: 2) and demo_ctr version 1; demo's folder keeps the policy
    Triton serves, so a retire of version 2 is refused until an activation settles it."""
    config, repo = ctr
    triton = Triton(repo, {"demo_ctr": {1}, "demo": {2}})  # demo's second load: the undo
    with pytest.raises(BackendError) as exc:
        activate(config, "demo", 2, triton, repo)  # type: ignore[arg-type]
    said = str(exc.value)
    assert "activating version 2 failed (" in said and "load failed for model 'demo_ctr'" in said
    assert "undoing it failed too: demo serves versions [1, 2] (unversioned requests: " \
           "version 2)" in said  # fmt: skip
    assert "demo_ctr serves versions [1]" in said and "record keeps version 1 live" in said
    assert triton.serving == {"demo": [1, 2], "demo_ctr": [1]}
    assert (policy_of(repo, "demo"), policy_of(repo, "demo_ctr")) == ([1, 2], [1])
    with pytest.raises(ConfigError, match="version 2 may be served by Triton: the version "
                       "policy written for demo names it"):  # fmt: skip
        retire(config, "demo", 2)
    assert VersionRegistry(config).get("demo", 2).state == "ready"

    done = activate(config, "demo", 1, triton, repo)  # type: ignore[arg-type]
    assert done.served == [1] and triton.serving == {"demo": [1], "demo_ctr": [1]}
    retire(config, "demo", 2)  # Triton is back on the record: it can go
