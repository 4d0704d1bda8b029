"""Models added and removed while a real `hps serve` runs, the others undisturbed."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from hps.config import ModelConfig
from hps.errors import ConfigError
from hps.io.sparse_model import write_sparse_model
from hps.loading.imports import repository_dir
from hps.triton.client import Client
from hps.triton.models import add_and_serve, remove
from hps.triton.serving import serving_config
from tests.integration.triton.test_serve_cli import run_hps
from tests.integration.triton.test_serve_lifecycle import stop
from tests.integration.triton.test_versions import control, started

pytestmark = pytest.mark.integration


@pytest.fixture
def site(tmp_path: Path) -> Path:
    run_hps("demo", "--dir", "demo", "--tables", "2", "--rows", "200", cwd=tmp_path)
    (tmp_path / "tmp").mkdir()
    return tmp_path


def extra(site: Path) -> ModelConfig:
    keys = np.arange(100, dtype=np.int64)
    write_sparse_model(site / "extra" / "t", keys, np.full((100, 4), 7.0, np.float32))
    return ModelConfig.model_validate({
        "model": "extra", "sparse_files": [str(site / "extra" / "t")],
        "embedding_table_names": ["t"], "embedding_vecsize_per_table": [4],
    })  # fmt: skip


def lookup(url: str, model: str, tables: int) -> np.ndarray:
    with Client(url) as client:
        return client.lookup(model, [1] * tables, [1] * tables)


def served(url: str, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{url}/v2/models/{model}/ready", timeout=5) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def test_models_added_and_removed_at_runtime(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(site)
    config = serving_config("demo/ps.json")
    repo = repository_dir(config)
    assert repo is not None
    proc, url = started(site)
    try:
        before = lookup(url, "demo", 2)
        version, names = add_and_serve(config, extra(site), control(site, url), repo)
        assert (version, names) == (1, ["extra"])
        np.testing.assert_array_equal(lookup(url, "extra", 1), np.full((1, 4), 7.0, np.float32))
        np.testing.assert_array_equal(lookup(url, "demo", 2), before)  # undisturbed
        with pytest.raises(ConfigError, match="served already"):
            add_and_serve(serving_config("demo/ps.json"), extra(site), control(site, url), repo)
    finally:
        stop(proc)
    proc, url = started(site)  # a restart serves it too
    try:
        assert served(url, "extra")
        config = serving_config("demo/ps.json")
        assert remove(config, "extra", control(site, url), repo, purge_rows=False) == ["extra"]
        assert not served(url, "extra") and served(url, "demo")
        assert not (repo / "extra").exists()
    finally:
        stop(proc)
    proc, url = started(site)  # removed: not served after a restart either
    try:
        assert not served(url, "extra") and served(url, "demo")
    finally:
        stop(proc)
