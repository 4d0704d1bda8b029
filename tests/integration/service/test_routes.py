"""The control plane's routes against a real tritonserver (hps serve's deployment)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np
import pytest

from hps.io.frequency import write_frequency_file
from hps.io.sparse_model import write_sparse_model
from tests.integration.service.conftest import Stack
from tests.integration.service.helpers import concurrent_rows, stub_pids, triton_rows

pytestmark = pytest.mark.integration


def _ready(client: Any) -> tuple[int, dict[str, Any]]:
    r = client.get("/readyz")
    return r.status_code, r.json()


def test_ready_models_and_lookup(client: Any, stack: Stack) -> None:
    status, body = _ready(client)
    assert status == 200, body
    names = {c["name"] for c in body["checks"]}
    assert {"triton", "model:emb", "inference:emb", "inference:one", "l2", "l3"} <= names
    models = client.get("/v1/models").json()
    assert models["topology"]["l2"] == "node" and models["topology"]["l3"] is True
    assert models["topology"]["write_channel"] == "direct+journal"
    listed = {t["table"]: t for m in models["models"] for t in m["tables"] if m["model"] == "emb"}
    # the listing takes RocksDB's estimate (exact after an import: nothing overwritten)
    assert listed["a"]["rows"] == {"l2": 400, "l3": 400}
    assert listed["a"]["rows_estimated"] == ["l3"]
    emb_a = client.get("/v1/models/emb/tables/a?exact=true").json()
    assert emb_a["dim"] == 4 and emb_a["rows"] == {"l2": 400, "l3": 400}
    assert emb_a["rows_estimated"] == []
    assert emb_a["l1"]["instances"] == 2 and emb_a["l1"]["policy"] == "lru"
    keys, vectors = stack.data["emb.a"]
    r = client.post("/v1/models/emb/tables/a/lookup", json={"keys": [int(keys[3]), 12345]})
    got = r.json()["results"]
    assert got[0]["found_in"] == "l2" and np.allclose(got[0]["vector"], vectors[3])
    assert got[1]["found_in"] == "default" and got[1]["vector"] == [0.5] * 4
    assert client.get("/v1/models/nope").status_code == 404
    assert client.get("/v1/models/emb/tables/zz").status_code == 404


def test_delete_reaches_every_instance(client: Any, stack: Stack) -> None:
    url = stack.server.http_url
    keys, vectors = stack.data["emb.a"]
    gone = keys[:5]
    for rows in concurrent_rows(url, "emb", 2, 0, gone):  # now resident in both instances' L1
        np.testing.assert_allclose(rows, vectors[:5])
    r = client.request("DELETE", "/v1/models/emb/tables/a/keys", json={"keys": gone.tolist()})
    assert r.status_code == 200, r.text
    assert r.json()["via"] == "journal" and r.json()["applied"] == 2
    for rows in concurrent_rows(url, "emb", 2, 0, np.concatenate([gone, keys[5:7]])):
        assert (rows[:5] == 0.5).all()  # the default vector, from whichever instance answered
        np.testing.assert_allclose(rows[5:], vectors[5:7])
    found = client.post("/v1/models/emb/tables/a/lookup", json={"keys": gone.tolist()[:2]})
    assert [x["found_in"] for x in found.json()["results"]] == ["default", "default"]
    assert client.get("/v1/models/emb/tables/a?exact=true").json()["rows"] == {"l2": 395, "l3": 395}


def test_killed_stub_turns_readiness_red_until_reload(client: Any, stack: Stack) -> None:
    pids = stub_pids(stack.server.repository, "one")
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    start = time.monotonic()
    status, body = _ready(client)
    while status == 200 and time.monotonic() - start < 60:  # hang guard
        time.sleep(0.2)
        status, body = _ready(client)
    print(f"readiness 503 {time.monotonic() - start:.2f}s after the stub's SIGKILL")
    assert status == 503, "readiness stayed 200 with a dead stub"
    failed = {c["name"] for c in body["checks"] if not c["ok"]}
    assert "inference:one" in failed, body
    r = client.post("/v1/models/one/reload")
    assert r.status_code == 200, r.text
    assert r.json() == {"reloaded": ["one"]}
    status, body = _ready(client)
    assert status == 200, body


def test_warmup_fills_l1_of_the_new_instances(client: Any, stack: Stack) -> None:
    keys, vectors = stack.data["one.r"]
    r = client.post("/v1/models/one/warmup", json={"keys": keys[:10].tolist()})
    assert r.status_code == 200, r.text
    assert r.json()["keys"] == {"r": 10}
    before = _hits(client, "one", "r")
    rows = triton_rows(stack.server.http_url, "one", 1, 0, keys[:15])
    np.testing.assert_allclose(rows, vectors[:15])
    deadline = time.monotonic() + 10
    while True:  # the serving process sends its counters to Triton's /metrics per batch
        hits = _hits(client, "one", "r")
        delta = {k: hits.get(k, 0) - before.get(k, 0) for k in ("l1", "l2", "l3", "default")}
        if sum(delta.values()) >= 15 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    # the 10 warmed keys come from L1, the 5 others from L2 (one may be resident already:
    # a readiness check's); the warm-up's own reads count as no hits
    assert delta["l1"] >= 10 and delta["l1"] + delta["l2"] == 15, delta
    assert delta["l3"] == delta["default"] == 0, delta
    # the hottest keys of a frequency file (under the ps.json's folder, a path root)
    freq = stack.root / "freq.npz"
    write_frequency_file(freq, keys, np.arange(keys.size))
    body = {"frequency_path": str(freq), "top_k": 7, "table": "r"}
    r = client.post("/v1/models/one/warmup", json=body)
    assert r.status_code == 200 and r.json()["keys"] == {"r": 7}, r.text
    r = client.post("/v1/models/one/warmup", json={"keyset_path": str(stack.root / "none")})
    assert r.status_code == 400, r.text


def _hits(client: Any, model: str, table: str) -> dict[str, float]:
    hits: dict[str, float] = client.get(f"/v1/models/{model}/tables/{table}").json()["hits"]
    return hits


def test_import_upload_then_triton_serves_it(client: Any, stack: Stack) -> None:
    rng = np.random.default_rng(5)
    keys = np.arange(10_000_000, 10_000_500, dtype=np.int64)
    vectors = rng.standard_normal((keys.size, 8), dtype=np.float32)
    folder = stack.root / "imports" / "new"  # under the ps.json's folder, a path root
    write_sparse_model(folder, keys, vectors)
    files = {
        "keys": ("key", (folder / "key").read_bytes()),
        "vectors": ("emb_vector", (folder / "emb_vector").read_bytes()),
    }
    r = client.post("/v1/models/emb/tables/b/import", data={"format": "sparse"}, files=files)
    assert r.status_code == 202, r.text
    job = _wait_job(client, r.json()["job"])
    assert job["state"] == "done" and job["rows_done"] == 500, job
    assert job["result"]["via"] == "journal" and job["result"]["applied"] == 2
    rows = triton_rows(stack.server.http_url, "emb", 2, 1, keys[:4])
    np.testing.assert_allclose(rows, vectors[:4])
    # a server-side folder works the same way
    r = client.post(
        "/v1/models/emb/tables/b/import", data={"format": "sparse", "path": str(folder)}
    )
    assert _wait_job(client, r.json()["job"])["state"] == "done"


def test_bad_imports_change_nothing(client: Any, stack: Stack) -> None:
    key = np.array([77_000_001, 77_000_002], dtype=np.int64).tobytes()
    short = np.ones(2 * 8 - 1, dtype=np.float32).tobytes()  # truncated emb_vector
    bad_dim = np.ones(2 * 5, dtype=np.float32).tobytes()
    nan = np.full(2 * 8, np.nan, dtype=np.float32).tobytes()
    for vectors, status in ((short, 422), (bad_dim, 422), (nan, 422)):
        files = {"keys": ("key", key), "vectors": ("emb_vector", vectors)}
        r = client.post("/v1/models/emb/tables/b/import", data={"format": "sparse"}, files=files)
        assert r.status_code == status, r.text
        assert "emb" in r.json()["detail"]
    r = client.post(
        "/v1/models/emb/tables/b/import",
        data={"format": "sparse"},
        files={"keys": ("key", key), "vectors": ("emb_vector", short)},
        headers={"Authorization": "Bearer wrong"},
    )
    assert r.status_code == 401
    r = client.post("/v1/models/emb/tables/zz/import", data={"format": "sparse", "path": "/x"})
    assert r.status_code == 404
    found = client.post("/v1/models/emb/tables/b/lookup", json={"keys": [77_000_001]})
    assert found.json()["results"][0]["found_in"] == "default"


def _wait_job(client: Any, job_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in ("done", "failed") or time.monotonic() > deadline:
            return job
        time.sleep(0.1)
