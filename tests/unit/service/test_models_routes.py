"""Models added and removed at runtime, as the control plane sees them, over real RocksDB
files and without Triton: the checks of ``POST /v1/models`` and ``DELETE
/v1/models/{model}`` (auth, 4xx), and the control plane following the models that another
process adds and removes through the node's record. Serving through a running `hps serve`
is tests/integration/service/test_models_api.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from hps.config import ModelConfig
from hps.io.sparse_model import write_sparse_model
from hps.loading.imports import repository_dir
from hps.service.app import create_app
from hps.service.state import AdminState
from hps.service.triton_admin import TritonAdmin
from hps.triton.serving import prepare_tables, serving_config
from hps.versions import VersionRegistry
from hps.versions.models import add_model, mark_removed
from tests.unit.commands.conftest import KEYS, write_tables

TOKEN = "models-token"


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[tuple[TestClient, AdminState]]:
    doc = {
        "models": [
            {
                "model": "demo",
                "sparse_files": write_tables(tmp_path / "v1", seed=0),
                "embedding_table_names": ["t0", "t1"],
                "embedding_vecsize_per_table": [4, 8],
                "gpucache": False,
            }
        ],
        "volatile_db": {"type": "hash_map"},
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rocksdb")},
    }
    (tmp_path / "ps.json").write_text(json.dumps(doc))
    config = serving_config(tmp_path / "ps.json")
    prepare_tables(config)
    state = AdminState(config, TOKEN, TritonAdmin("127.0.0.1:1"), state_dir=tmp_path / "admin")
    with TestClient(create_app(state)) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield client, state


def extra(folder: Path, value: float = 7.0) -> dict[str, Any]:
    """The entry of a one-table model ``extra`` (dim 2) whose every row is ``value``."""
    write_sparse_model(folder / "t", KEYS, np.full((KEYS.size, 2), value, np.float32))
    return {
        "model": "extra",
        "sparse_files": [str(folder / "t")],
        "embedding_table_names": ["t"],
        "embedding_vecsize_per_table": [2],
        "gpucache": False,
    }


def names(client: TestClient) -> list[str]:
    r = client.get("/v1/models")
    assert r.status_code == 200, r.text
    return [m["model"] for m in r.json()["models"]]


def test_refusals_change_nothing(admin: tuple[TestClient, AdminState], tmp_path: Path) -> None:
    client, state = admin
    body = extra(tmp_path / "extra")
    for token in ("", "Bearer wrong"):
        r = client.post("/v1/models", json=body, headers={"Authorization": token})
        assert r.status_code == 401 and r.json()["error"] == "Unauthorized"
        r = client.delete("/v1/models/demo", headers={"Authorization": token})
        assert r.status_code == 401
    demo = {**body, "model": "demo"}
    for bad, status, says in [
        ({k: v for k, v in body.items() if k != "embedding_table_names"} | {"x": 1}, 422, "Extra"),
        ({**body, "colour": "red"}, 422, "Extra inputs are not permitted"),
        ({**body, "version": 2}, 422, "version is not a ps.json key"),
        ({**body, "model": "no/slash"}, 422, "must match"),
        ({**body, "sparse_files": body["sparse_files"] * 2}, 422, "sparse_files has 2 entries"),
        ({**body, "sparse_files": []}, 400, "one HugeCTR sparse-model folder per table"),
        ({**body, "sparse_files": ["/etc"]}, 400, "path not allowed or not found: '/etc'"),
        ({**body, "sparse_files": ["relative/t"]}, 400, "path not allowed or not found"),
        ({**body, "dense_file": "/etc/passwd"}, 400, "path not allowed or not found"),
        ({**body, "hps_cache": {"warmup_keyset": "/etc/hosts"}}, 400, "path not allowed"),
        ({**body, "embedding_vecsize_per_table": [3]}, 422, "wrong embedding_vecsize"),
        (demo, 409, "model 'demo' is served already"),
        (body, 409, "no model repository of hps serve"),  # hps serve wrote none here
        ({**body, "embedding_table_names": ["t"] * 5000}, 422, "at most 4096 items"),
    ]:
        r = client.post("/v1/models", json=bad)
        assert r.status_code == status and says in json.dumps(r.json()), (bad, r.text)
        assert set(r.json()) == {"error", "detail"}
    r = client.post("/v1/models", json={**body, "max_batch_size": "x", "sparse_files": [1] * 50})
    assert r.status_code == 422 and len(r.json()["detail"]) == 21  # 51 errors: 20 listed
    assert r.json()["detail"][-1]["msg"] == "and 31 more errors"
    r = client.delete("/v1/models/nope")
    assert r.status_code == 404 and "unknown model 'nope'" in r.json()["detail"]
    assert client.get("/v1/models/nope").status_code == 404
    r = client.get("/v1/models/demo")
    assert r.status_code == 200 and [t["table"] for t in r.json()["tables"]] == ["t0", "t1"]
    r = client.delete("/v1/models/demo")
    assert r.status_code == 409 and "last one this node serves" in r.json()["detail"]
    r = client.get("/v1/models")
    assert r.status_code == 200 and names(client) == ["demo"]
    r = client.put("/v1/models")
    assert r.status_code == 405 and r.headers["Allow"] == "GET, POST"
    r = client.post("/v1/models/demo")
    assert r.status_code == 405 and r.headers["Allow"] == "DELETE, GET"
    assert state.jobs.load() == (0, 0)  # nothing was queued


def wait_job(client: TestClient, job: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        view: dict[str, Any] = client.get(f"/v1/jobs/{job}").json()
        if view["state"] not in ("queued", "running"):
            return view
        time.sleep(0.05)
    raise AssertionError(f"job {job} still pending")


def test_a_failed_addition_leaves_nothing(
    admin: tuple[TestClient, AdminState], tmp_path: Path
) -> None:
    client, state = admin
    repository = repository_dir(state.config)
    assert repository is not None
    repository.mkdir()  # empty: no model of hps serve to take Triton parameters from
    body = extra(tmp_path / "extra")
    r = client.post("/v1/models", json=body)
    assert r.status_code == 202, r.text
    assert r.json()["rows"] == KEYS.size and r.json()["model"] == "extra"
    job = wait_job(client, r.json()["job"])
    assert job["state"] == "failed" and job["kind"] == "add_model", job
    assert "no model written by hps serve" in job["error"]
    assert names(client) == ["demo"]
    assert client.get("/v1/models/extra/versions").status_code == 404

    # a bad value fails the job before anything is written
    bad = extra(tmp_path / "bad")
    vectors = np.fromfile(Path(bad["sparse_files"][0]) / "emb_vector", np.float32)
    vectors[3] = np.inf
    vectors.tofile(Path(bad["sparse_files"][0]) / "emb_vector")
    job = wait_job(client, client.post("/v1/models", json=bad).json()["job"])
    assert job["state"] == "failed" and "NaN or infinity" in job["error"], job
    assert names(client) == ["demo"]


def test_the_control_plane_follows_models_added_and_removed_elsewhere(
    admin: tuple[TestClient, AdminState], tmp_path: Path
) -> None:
    client, state = admin
    other = serving_config(tmp_path / "ps.json")  # another process of the node (Python API)
    entry = ModelConfig.model_validate(extra(tmp_path / "extra"))
    assert add_model(other, entry) == 1
    assert names(client) == ["demo", "extra"]  # no restart
    r = client.get("/v1/models/extra")
    assert r.status_code == 200, r.text
    assert (r.json()["version"], r.json()["tables"][0]["rows"]["l3"]) == (1, KEYS.size)
    r = client.post("/v1/models/extra/tables/t/lookup", json={"keys": [1, 2]})
    assert r.status_code == 200, r.text
    assert [x["vector"] for x in r.json()["results"]] == [[7.0, 7.0], [7.0, 7.0]]
    r = client.get("/v1/models/extra/tables/t")
    assert r.status_code == 200 and r.json()["rows"]["l3"] == KEYS.size
    assert client.get("/v1/models/extra/versions").json()["live"] == 1
    r = client.post("/v1/models", json=extra(tmp_path / "extra"))
    assert r.status_code == 409 and "served already" in r.json()["detail"]

    mark_removed(serving_config(tmp_path / "ps.json"), "extra")
    assert names(client) == ["demo"]
    assert client.get("/v1/models/extra").status_code == 404
    r = client.post("/v1/models/extra/tables/t/lookup", json={"keys": [1]})
    assert r.status_code == 404
    r = client.delete("/v1/models/demo")  # the last one served now
    assert r.status_code == 409
    r = client.post("/v1/models", json=extra(tmp_path / "extra"))
    assert r.status_code == 409 and "its rows are kept" in r.json()["detail"]
    r = client.delete("/v1/models/extra")  # removed already: nothing to do without purge
    assert r.status_code == 200, r.text
    assert r.json() == {
        "model": "extra", "served": False, "changed": False, "unloaded": [], "purged": [],
        "shared_rows_kept": [],
    }  # fmt: skip
    r = client.delete("/v1/models/extra", params={"purge": "true"})
    assert r.status_code == 200 and r.json()["purged"] == [1] and r.json()["changed"], r.text
    assert client.delete("/v1/models/extra", params={"purge": True}).json()["changed"] is False
    # a version whose rows a drop left (L3 held meanwhile) is purged again
    VersionRegistry(state.config).set_state("extra", 1, "retired", rows_left=True)
    r = client.delete("/v1/models/extra", params={"purge": True})
    assert r.status_code == 200 and r.json()["purged"] == [1] and r.json()["changed"], r.text
    assert VersionRegistry(state.config).rows_left("extra") == []
    r = client.post("/v1/models", json=extra(tmp_path / "extra"))  # purged: may come back
    assert r.status_code == 409 and "no model repository" in r.json()["detail"]
