"""The table report's row counts (RocksDB's estimate unless ``exact``), the bound on exact
counts (429 past it), and ``/healthz`` answering while every worker thread is busy."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from hps.service import health, info
from hps.service.app import create_app
from hps.service.state import AdminState
from hps.service.triton_admin import TritonAdmin
from hps.triton.serving import prepare_tables, serving_config
from tests.unit.commands.conftest import KEYS, write_ps_json

TOKEN = "report-token"
HANG_S = 30.0  # hang guards only


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[tuple[TestClient, AdminState]]:
    """The control plane over a node whose version 1 (40 rows a table) is in RocksDB."""
    config = serving_config(write_ps_json(tmp_path))
    prepare_tables(config)
    state = AdminState(config, TOKEN, TritonAdmin("127.0.0.1:1"), state_dir=tmp_path / "admin")
    with TestClient(create_app(state)) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield client, state


def test_the_table_report_counts_exactly_only_when_asked(
    admin: tuple[TestClient, AdminState],
) -> None:
    client, _ = admin
    r = client.request("DELETE", "/v1/models/demo/tables/t0/keys", json={"keys": [0, 1, 2]})
    assert r.status_code == 200, r.text
    report = client.get("/v1/models/demo/tables/t0").json()
    assert report["rows_estimated"] == ["l3"]  # RocksDB's estimate (deletes not compacted)
    assert isinstance(report["rows"]["l3"], int)
    exact = client.get("/v1/models/demo/tables/t0", params={"exact": "true"}).json()
    assert exact["rows_estimated"] == [] and exact["rows"]["l3"] == len(KEYS) - 3
    r = client.get("/v1/models/demo/tables/t0", params={"exact": "maybe"})
    assert r.status_code == 422


def test_exact_counts_past_the_bound_are_a_429(admin: tuple[TestClient, AdminState]) -> None:
    client, _ = admin
    held = 0
    try:
        for _ in range(info.MAX_EXACT_COUNTS):  # as many exact counts as may run, running
            assert info._exact_counts.acquire(blocking=False)
            held += 1
        for path in ("/v1/models/demo/tables/t0", "/v1/models/demo/versions"):
            r = client.get(path, params={"exact": "true"})
            assert r.status_code == 429, r.text
            assert r.headers["retry-after"] == str(info.EXACT_RETRY_S)
            detail = r.json()["detail"]
            assert f"{info.MAX_EXACT_COUNTS} exact row counts are running" in detail
            assert "leave exact out" in detail
            assert client.get(path).status_code == 200  # the estimate takes no place
    finally:
        for _ in range(held):
            info._exact_counts.release()
    r = client.get("/v1/models/demo/tables/t0", params={"exact": "true"})
    assert r.status_code == 200 and r.json()["rows"]["l3"] == len(KEYS)


def test_healthz_answers_while_every_worker_thread_is_busy(
    admin: tuple[TestClient, AdminState], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/readyz`` (sync: it runs on anyio's 40 worker threads) blocked in 50 requests:
    ``/healthz`` is answered on the event loop all the same."""
    client, _ = admin
    gate = threading.Event()
    blocked = threading.Semaphore(0)

    def stuck(state: AdminState) -> tuple[bool, list[object]]:
        blocked.release()
        gate.wait(HANG_S)
        return True, []

    monkeypatch.setattr(health, "readiness", stuck)
    probes = [threading.Thread(target=client.get, args=("/readyz",)) for _ in range(50)]
    for t in probes:
        t.start()
    try:
        for _ in range(40):  # every worker thread taken
            assert blocked.acquire(timeout=HANG_S)
        answered: list[int] = []
        t = threading.Thread(target=lambda: answered.append(client.get("/healthz").status_code))
        t.start()
        t.join(5.0)
        assert answered == [200]
    finally:
        gate.set()
        for t in probes:
            t.join(HANG_S)
