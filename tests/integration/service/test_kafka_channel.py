"""With Kafka configured, imports and deletes travel as updates (Publisher → hps consume).

Real Tansu broker, real Redis (the shared L2) and RocksDB (L3); the consumer service runs
as ``hps consume`` does (its loop in a thread). Triton is not part of this test: the control
plane publishes, and what the consumer applied shows in its lookup route and table report.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from hps.build import build_session
from hps.net import free_port
from hps.service.app import create_app
from hps.service.state import AdminState
from hps.service.triton_admin import TritonAdmin
from hps.testing.kafka import TansuBroker
from hps.updates.runtime import build_service
from tests.fixtures.kafka import running, update_config, wait_for
from tests.integration.service.conftest import TOKEN

pytestmark = pytest.mark.integration


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _found(client: Any, table: str, keys: np.ndarray) -> list[str]:
    r = client.post(f"/v1/models/{table}/lookup", json={"keys": keys.tolist()})
    return [x["found_in"] for x in r.json()["results"]]


def test_import_and_delete_go_through_kafka(
    tmp_path: Path, kafka_broker: TansuBroker, redis_server: Any, redis_address: str
) -> None:
    cfg = update_config(
        tmp_path,
        kafka_broker.bootstrap,
        volatile={"type": "redis", "address": redis_address, "num_partitions": 2},
    )
    model = cfg.models[0].model
    session = build_session(cfg, with_cache=False)  # what `hps consume` opens (L3 writer)
    keys = np.arange(5_000, 6_000, dtype=np.int64)
    vectors = np.random.default_rng(2).standard_normal((keys.size, 4), dtype=np.float32)
    triton = TritonAdmin(f"127.0.0.1:{free_port()}")  # no Triton here
    state = AdminState(cfg, TOKEN, triton, state_dir=tmp_path / "admin")
    try:
        with (
            running(build_service(cfg, session)) as svc,
            TestClient(create_app(state)) as client,
        ):
            client.headers["Authorization"] = f"Bearer {TOKEN}"
            files = {"keys": ("k.npy", _npy(keys)), "vectors": ("v.npy", _npy(vectors))}
            r = client.post(
                f"/v1/models/{model}/tables/t0/import", data={"format": "npy"}, files=files
            )
            assert r.status_code == 202, r.text
            job_id = r.json()["job"]
            job = wait_for(
                lambda: (
                    (j := client.get(f"/v1/jobs/{job_id}").json())["state"] != "running"
                    and j["state"] != "queued"
                    and j
                ),
                60,
                "the import job",
            )
            assert job["state"] == "done" and job["result"]["via"] == "kafka", job
            wait_for(lambda: svc.rows_applied >= keys.size, 60, "the import applied")
            table = f"{model}/tables/t0"
            wait_for(lambda: set(_found(client, table, keys[:5])) == {"l2"}, 30, "rows in L2")
            got = client.post(f"/v1/models/{table}/lookup", json={"keys": [int(keys[0])]}).json()
            assert np.allclose(got["results"][0]["vector"], vectors[0])
            assert got["results"][0]["version"] == job["result"]["version"]

            r = client.request(
                "DELETE", f"/v1/models/{table}/keys", json={"keys": keys[:3].tolist()}
            )
            assert r.status_code == 200 and r.json()["via"] == "kafka", r.text
            wait_for(
                lambda: _found(client, table, keys[:4]) == ["default"] * 3 + ["l2"],
                30,
                "the delete applied to L2 and L3",
            )
            wait_for(  # the consumer commits after applying, at its next empty poll
                lambda: (
                    set(client.get(f"/v1/models/{table}").json()["consumer_lag"].values()) == {0}
                ),
                30,
                "the consumer's commit",
            )
            report = client.get(f"/v1/models/{table}?exact=true").json()
            assert report["rows"] == {"l2": keys.size - 3, "l3": keys.size - 3}
            assert report["last_update_version"] == r.json()["version"]
            assert set(report["consumer_lag"].values()) == {0}, report["consumer_lag"]
            ready = client.get("/readyz").json()["checks"]
            assert {c["name"]: c["ok"] for c in ready}["kafka"] is True
    finally:
        state.close()
        session.close()
