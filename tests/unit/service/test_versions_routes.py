"""The model-version routes over real RocksDB files, without Triton: list, import (a job),
retire, their errors and auth; the table routes follow the version recorded live.
Activation through a running `hps serve` is tests/integration/service/test_versions_api.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from hps.io.sparse_model import write_sparse_model
from hps.service.app import create_app
from hps.service.state import AdminState
from hps.service.triton_admin import TritonAdmin
from hps.triton.serving import prepare_tables, serving_config
from hps.versions import VersionRegistry
from tests.helpers import rows
from tests.unit.commands.conftest import KEYS, write_ps_json, write_tables

TOKEN = "versions-token"


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[tuple[TestClient, AdminState]]:
    config = serving_config(write_ps_json(tmp_path))
    prepare_tables(config)  # version 1, as hps serve imports it
    state = AdminState(config, TOKEN, TritonAdmin("127.0.0.1:1"), state_dir=tmp_path / "admin")
    with TestClient(create_app(state)) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield client, state


def wait_job(client: TestClient, job: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        view: dict[str, Any] = client.get(f"/v1/jobs/{job}").json()
        if view["state"] not in ("queued", "running"):
            return view
        time.sleep(0.05)
    raise AssertionError(f"job {job} still pending")


def import_v(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/models/demo/versions", json=body)
    assert r.status_code == 202, r.text
    return wait_job(client, r.json()["job"])


def lookup_t0(client: TestClient) -> np.ndarray:
    r = client.post("/v1/models/demo/tables/t0/lookup", json={"keys": KEYS[:3].tolist()})
    assert r.status_code == 200, r.text
    return np.array([x["vector"] for x in r.json()["results"]], np.float32)


def test_import_list_and_errors(admin: tuple[TestClient, AdminState], tmp_path: Path) -> None:
    client, _ = admin
    listed = client.get("/v1/models/demo/versions").json()
    assert (listed["live"], listed["served"], listed["keep_versions"]) == (1, [1], 2)
    (one,) = listed["versions"]
    assert (one["version"], one["state"], one["created"], one["served"]) == (1, "live", None, True)
    assert one["rows"] == {"l2": None, "l3": 80}  # hash_map: each serving process's own L2
    assert one["bytes"]["l2"] is None and one["bytes"]["l3"] > 80 * 4 * 4

    v2 = write_tables(tmp_path / "v2", seed=5)
    body = {"version": 2, "sparse_files": v2}
    r = client.post("/v1/models/demo/versions", json=body, headers={"Authorization": ""})
    assert r.status_code == 401 and r.json()["error"] == "Unauthorized"
    for bad, status, says in [
        ({**body, "sparse_files": v2[:1]}, 400, "2 tables ("),
        ({**body, "sparse_files": ["/etc", "/usr"]}, 400, "path not allowed or not found"),
        ({**body, "dense_file": "/etc/passwd"}, 400, "path not allowed or not found"),
        ({**body, "version": 0}, 422, "greater than or equal to 1"),
        ({**body, "version": True}, 422, "must be a JSON integer"),
        ({**body, "version": 2.5}, 422, "fractional part"),
        ({**body, "version": 1}, 409, "version 1 exists (live)"),
    ]:
        r = client.post("/v1/models/demo/versions", json=bad)
        assert r.status_code == status and says in json.dumps(r.json()), (bad, r.text)
    r = client.post("/v1/models/nope/versions", json=body)
    assert r.status_code == 404 and "unknown model 'nope'" in r.json()["detail"]

    job = import_v(client, body)
    assert job["state"] == "done", job
    assert job["kind"] == "import_version" and job["rows_done"] == job["rows_total"] == 80
    assert job["result"]["rows"] == {"demo.t0@2": 40, "demo.t1@2": 40}
    r = client.post("/v1/models/demo/versions", json=body)
    assert r.status_code == 409 and "version 2 exists (ready)" in r.json()["detail"]

    listed = client.get("/v1/models/demo/versions", params={"exact": True}).json()
    two = listed["versions"][1]
    assert (two["version"], two["state"], two["served"]) == (2, "ready", False)
    assert two["created"] > 0 and two["rows"]["l3"] == 80 and listed["rows_estimated"] == []
    np.testing.assert_array_equal(lookup_t0(client), rows(KEYS[:3], 4, 0))  # still version 1

    # a version whose values cannot be stored fails its job and leaves nothing
    bad = write_tables(tmp_path / "v3", seed=0)
    vectors = np.fromfile(Path(bad[0]) / "emb_vector", np.float32)
    vectors[5] = np.nan
    vectors.tofile(Path(bad[0]) / "emb_vector")
    job = import_v(client, {"version": 3, "sparse_files": bad})
    assert job["state"] == "failed" and "NaN or infinity" in job["error"], job
    listed = client.get("/v1/models/demo/versions").json()["versions"]
    assert [v["version"] for v in listed] == [1, 2]


def test_activate_and_retire_errors_and_the_live_version_of_table_routes(
    admin: tuple[TestClient, AdminState], tmp_path: Path
) -> None:
    client, state = admin
    v2 = write_tables(tmp_path / "v2", seed=5)
    assert import_v(client, {"version": 2, "sparse_files": v2})["state"] == "done"
    r = client.post("/v1/models/demo/versions/9/activate")
    assert r.status_code == 404 and "has no version 9" in r.json()["detail"]
    r = client.post("/v1/models/demo/versions/0/activate")
    assert r.status_code == 422
    r = client.post("/v1/models/demo/versions/2/activate")  # hps serve wrote no repository
    assert r.status_code == 409 and "no model repository of hps serve" in r.json()["detail"]
    r = client.post("/v1/models/demo/versions/2/activate", headers={"Authorization": "Bearer x"})
    assert r.status_code == 401

    # live as an activation records it (e.g. `hps versions activate` on this node): the table
    # routes follow at once
    registry = VersionRegistry(state.config)
    registry.set_live("demo", 2)
    np.testing.assert_array_equal(lookup_t0(client), rows(KEYS[:3], 4, 5))
    table = client.get("/v1/models/demo/tables/t0").json()
    assert table["version"] == 2 and table["rows"]["l3"] == 40
    models = client.get("/v1/models").json()["models"]
    assert models[0]["version"] == 2 and models[0]["tables"][0]["version"] == 2

    r = client.delete("/v1/models/demo/versions/2")
    assert r.status_code == 409 and "is live" in r.json()["detail"]
    r = client.delete("/v1/models/demo/versions/1")  # kept for rollback, served below 2
    assert r.status_code == 409 and "is served" in r.json()["detail"]
    r = client.delete("/v1/models/demo/versions/9")
    assert r.status_code == 404
    r = client.delete("/v1/models/demo/versions/1", headers={"Authorization": ""})
    assert r.status_code == 401

    registry.set_live("demo", 1)  # a rollback: version 2 is kept but no longer served
    np.testing.assert_array_equal(lookup_t0(client), rows(KEYS[:3], 4, 0))
    r = client.delete("/v1/models/demo/versions/2")
    assert r.status_code == 200, r.text
    assert r.json() == {"model": "demo", "version": 2, "state": "retired", "changed": True}
    assert client.delete("/v1/models/demo/versions/2").json()["changed"] is False
    listed = client.get("/v1/models/demo/versions").json()["versions"]
    assert [(v["version"], v["state"], v["rows"]["l3"]) for v in listed] == [
        (1, "live", 80),
        (2, "retired", None),
    ]
    r = client.post("/v1/models/demo/versions/2/activate")
    assert r.status_code == 409 and "is retired, not ready" in r.json()["detail"]
    r = client.post("/v1/models/demo/versions", json={"version": 2})
    assert r.status_code == 409 and "version 2 exists (retired)" in r.json()["detail"]


def test_a_retired_version_whose_rows_were_left_is_listed_so_and_retired_again(
    admin: tuple[TestClient, AdminState], tmp_path: Path
) -> None:
    client, state = admin
    assert import_v(client, {"version": 2, "sparse_files": write_tables(tmp_path / "v2", 5)})
    # what a retire whose drop failed (L3 held by hps consume) leaves
    VersionRegistry(state.config).set_state("demo", 2, "retired", rows_left=True)
    listed = client.get("/v1/models/demo/versions").json()["versions"]
    assert [(v["version"], v["state"], v["rows_left"]) for v in listed][1] == (2, "retired", True)
    r = client.delete("/v1/models/demo/versions/2")
    assert r.status_code == 200 and r.json()["changed"] is True, r.text
    listed = client.get("/v1/models/demo/versions").json()["versions"]
    assert listed[1]["rows_left"] is False
    assert VersionRegistry(state.config).rows_left("demo") == []


class _ChangedMeanwhile:
    """A versions lock that, as it is taken, lets ``change`` run first: what another
    activation or retire (this process's or another's) does between a route's checks and
    the lock it then waits for."""

    def __init__(self, change: Callable[[], None]) -> None:
        self.change = change
        self.lock = threading.Lock()

    def __enter__(self) -> None:
        self.change()
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_a_version_changed_between_the_checks_and_the_lock_is_a_409(
    admin: tuple[TestClient, AdminState], tmp_path: Path
) -> None:
    client, state = admin
    assert import_v(client, {"version": 2, "sparse_files": write_tables(tmp_path / "v2", 5)})
    registry = VersionRegistry(state.config)
    # a retire of 2 passes its checks (2 is ready), then 2 is activated before it locks
    state.versions_lock = _ChangedMeanwhile(lambda: registry.set_live("demo", 2))  # type: ignore[assignment]
    r = client.delete("/v1/models/demo/versions/2")
    assert r.status_code == 409 and "is live" in r.json()["detail"], r.text
    assert registry.get("demo", 2).state == "live"

    # a rollback to 1 passes its checks (1 is ready), then 1 is retired before it locks
    state.repository = tmp_path / "repository"
    state.repository.mkdir()
    state.versions_lock = _ChangedMeanwhile(  # type: ignore[assignment]
        lambda: registry.set_state("demo", 1, "retired")
    )
    r = client.post("/v1/models/demo/versions/1/activate")
    assert r.status_code == 409 and "is retired, not ready" in r.json()["detail"], r.text


def _l3_rows_of_v2(state: AdminState) -> int:
    """Table t0's rows of version 2 in L3 (a reader of its own: the version is not declared
    by the control plane's reader while loading or retired)."""
    from hps.tiers import Tiers

    spec = state.config.model("demo").at_version(2).tables[0]
    tiers = Tiers.open(state.config, l3_mode="read_write", l2=False)
    try:
        assert tiers.persistent is not None
        tiers.open_tables([spec])
        _, found = tiers.persistent.fetch(spec.name, KEYS)
        return int(found.sum())
    finally:
        tiers.close()


def test_a_loading_version_is_retired_once_its_import_died(
    admin: tuple[TestClient, AdminState], tmp_path: Path
) -> None:
    """Refused while an import holds it; once none does (its importer died), retired and its
    rows dropped, as ``hps versions retire`` does."""
    from hps.versions.rollout import _importing

    client, state = admin
    assert import_v(client, {"version": 2, "sparse_files": write_tables(tmp_path / "v2", 5)})
    registry = VersionRegistry(state.config)
    registry.set_state("demo", 2, "loading")  # rows written, `ready` never recorded
    assert _l3_rows_of_v2(state) == len(KEYS)
    with _importing(state.config, "demo", 2):  # an import still writes it
        r = client.delete("/v1/models/demo/versions/2")
        assert r.status_code == 409 and "is loading" in r.json()["detail"], r.text
    assert registry.get("demo", 2).state == "loading"
    r = client.delete("/v1/models/demo/versions/2")  # nobody imports it any more
    assert r.status_code == 200, r.text
    assert r.json() == {"model": "demo", "version": 2, "state": "retired", "changed": True}
    assert registry.get("demo", 2).state == "retired" and registry.rows_left("demo") == []
    assert _l3_rows_of_v2(state) == 0


def _tables_float16_rounds(folder: Path) -> list[str]:
    """Version files whose values float16 rounds (version 1's do not differ by it)."""
    paths = []
    for name, dim in (("t0", 4), ("t1", 8)):
        write_sparse_model(folder / name, KEYS, rows(KEYS, dim) + 0.1)
        paths.append(str(folder / name))
    return paths


def test_a_version_in_its_own_row_format_and_the_body_s_errors(
    admin: tuple[TestClient, AdminState], tmp_path: Path
) -> None:
    client, state = admin
    v2 = _tables_float16_rounds(tmp_path / "v2")
    body = {"version": 2, "sparse_files": v2}
    for bad, status, says in [
        ({**body, "row_dtype": "float8"}, 422, "'float32', 'float16' or 'int8'"),
        ({**body, "row_dtype": []}, 422, "row_dtype"),
        ({**body, "dims": 0}, 422, "greater than or equal to 1"),
        ({**body, "dims": [4, 65537]}, 422, "less than or equal to 65536"),
        ({**body, "dims": [4, True]}, 422, "dims"),
        ({**body, "row_dtype": ["float16"] * 3}, 400, "2 tables (t0, t1) but 3 row formats"),
        ({**body, "dims": [4, 8, 8]}, 400, "2 tables (t0, t1) but 3 dimensions were given"),
        ({**body, "dims": [6]}, 422, "x dim 6"),  # the files hold dims 4 and 8
    ]:
        r = client.post("/v1/models/demo/versions", json=bad)
        assert r.status_code == status and says in json.dumps(r.json()), (bad, r.text)
        assert "function-after" not in r.text and " at 0x" not in r.text  # no validator reprs
    assert [v.version for v in VersionRegistry(state.config).versions("demo")] == [1]

    job = import_v(client, {**body, "row_dtype": "float16"})
    assert job["state"] == "done", job
    registry = VersionRegistry(state.config)
    assert [t.row_dtype for t in registry.model_at("demo", 2).tables] == ["float16"] * 2
    registry.set_live("demo", 2)  # as an activation records it
    want = (rows(KEYS[:3], 4) + 0.1).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(lookup_t0(client), want)
    assert not np.array_equal(want, rows(KEYS[:3], 4) + 0.1)
    registry.set_live("demo", 1)  # rolled back: version 1's float32 rows
    np.testing.assert_array_equal(lookup_t0(client), rows(KEYS[:3], 4, 0))


def test_a_queued_version_import_resumed_at_start_keeps_its_row_formats_and_dims(
    admin: tuple[TestClient, AdminState], tmp_path: Path
) -> None:
    from hps.service.job_records import Job
    from hps.service.versions import IMPORT_JOB, resume_import

    client, state = admin
    body = {"version": 2, "sparse_files": write_tables(tmp_path / "v2", 5), "dims": [4, 8],
            "row_dtype": ["int8", "float16"]}  # fmt: skip
    r = client.post("/v1/models/demo/versions", json=body)
    assert r.status_code == 202, r.text
    assert wait_job(client, r.json()["job"])["state"] == "done"
    params = state.jobs.get(r.json()["job"]).params  # what a restart reads back
    job = Job(IMPORT_JOB, "demo@3", 80, params={**params, "version": "3"})
    resume_import(state, job)(job)
    tables = VersionRegistry(state.config).model_at("demo", 3).tables
    assert [(t.row_dtype, t.dim) for t in tables] == [("int8", 4), ("float16", 8)]


def test_a_ps_json_edited_for_the_retrain_is_a_409_at_the_first_versioned_import(
    tmp_path: Path,
) -> None:
    """Version 1 would be recorded from the edited entry (float16) while L3 holds it as
    float32: refused before a job is queued, nothing recorded or written."""
    import rocksdict as rd

    path = write_ps_json(tmp_path)
    prepare_tables(serving_config(path))  # version 1, float32
    doc = json.loads(path.read_text())
    doc["models"][0]["hps_row_dtype"] = "float16"
    path.write_text(json.dumps(doc))
    state = AdminState(serving_config(path), TOKEN, TritonAdmin("127.0.0.1:1"),
                       state_dir=tmp_path / "admin")  # fmt: skip
    with TestClient(create_app(state)) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        body = {"version": 2, "sparse_files": write_tables(tmp_path / "v2", 5)}
        r = client.post("/v1/models/demo/versions", json=body)
    assert r.status_code == 409, r.text
    detail = r.json()["detail"]
    assert "table t0 is held in L3 (rocks_db) as float32 rows of dimension 4 but configured " \
        "as float16 rows of dimension 4" in detail  # fmt: skip
    assert "restore the entry version 1 was imported from" in detail and "row_dtype" in detail
    assert not (tmp_path / "rocksdb.hps-versions.json").exists()  # nothing recorded
    cfs = rd.Rdict.list_cf(str(tmp_path / "rocksdb"), rd.Options(raw_mode=True))
    assert [c for c in cfs if "@" in c] == []  # nothing written


def test_a_version_the_written_version_policy_names_is_not_retired(
    admin: tuple[TestClient, AdminState], tmp_path: Path
) -> None:
    """An activation of version 2 that did not finish (its process killed after Triton was
    given the policy [1, 2]): the record does not serve 2, the repository's policy does;
    DELETE is a 409 saying what to run, and goes through once the policy is settled."""
    client, state = admin
    assert import_v(client, {"version": 2, "sparse_files": write_tables(tmp_path / "v2", 5)})
    assert state.repository is not None
    policy = state.repository / "demo" / "config.pbtxt"
    policy.parent.mkdir(parents=True, exist_ok=True)
    policy.write_text('name: "demo"\nversion_policy: { specific: { versions: [ 1, 2 ] } }\n')
    r = client.delete("/v1/models/demo/versions/2")
    assert r.status_code == 409, r.text
    assert "version 2 may be served by Triton" in r.json()["detail"]
    assert "activate version 1 (the recorded live one)" in r.json()["detail"]
    assert VersionRegistry(state.config).get("demo", 2).state == "ready"
    policy.write_text('name: "demo"\nversion_policy: { specific: { versions: [ 1 ] } }\n')
    r = client.delete("/v1/models/demo/versions/2")
    assert r.status_code == 200 and r.json()["changed"] is True, r.text


def test_concurrent_imports_of_one_number_queue_one_and_refuse_the_others(
    admin: tuple[TestClient, AdminState], tmp_path: Path
) -> None:
    """The number is checked and taken at submit time: while the first import of version 2
    waits in the queue (a job ahead holds the worker), the others are a 409, not jobs that
    fail later."""
    from hps.service.job_records import Job

    client, state = admin
    v2 = write_tables(tmp_path / "v2", seed=5)
    gate, ahead = threading.Event(), threading.Event()

    def hold(job: Job) -> dict[str, Any]:
        ahead.set()
        gate.wait(60)
        return {}

    state.jobs.submit(Job("hold", "x", 0), hold)
    assert ahead.wait(60)
    answers: list[Any] = [None] * 6

    def post(i: int) -> None:
        body = {"version": 2, "sparse_files": v2}
        answers[i] = client.post("/v1/models/demo/versions", json=body)

    threads = [threading.Thread(target=post, args=(i,)) for i in range(6)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        gate.set()
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [202, 409, 409, 409, 409, 409], [r.text for r in answers]
    refused = [r.json()["detail"] for r in answers if r.status_code == 409]
    assert all("version 2 is being imported" in d for d in refused), refused
    (accepted,) = [r.json()["job"] for r in answers if r.status_code == 202]
    assert wait_job(client, accepted)["state"] == "done"
    r = client.post("/v1/models/demo/versions", json={"version": 2, "sparse_files": v2})
    assert r.status_code == 409 and "version 2 exists (ready)" in r.json()["detail"]


class _CountingLock:
    """A lock that counts the threads that asked for it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.asked = 0

    def __enter__(self) -> None:
        self.asked += 1  # under the GIL; read once every thread has asked
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_of_concurrent_retires_of_one_version_one_says_changed(
    admin: tuple[TestClient, AdminState], tmp_path: Path
) -> None:
    """Four retires that all passed the checks before the lock: one retires, the others
    find it retired under the lock."""
    client, state = admin
    assert import_v(client, {"version": 2, "sparse_files": write_tables(tmp_path / "v2", 5)})
    lock = _CountingLock()
    state.versions_lock = lock  # type: ignore[assignment]
    answers: list[Any] = [None] * 4

    def retire(i: int) -> None:
        answers[i] = client.delete("/v1/models/demo/versions/2")

    threads = [threading.Thread(target=retire, args=(i,)) for i in range(4)]
    with lock.lock:  # every retire checks the version, then waits here
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while lock.asked < 4:
            assert time.monotonic() < deadline, lock.asked
            time.sleep(0.01)
    for t in threads:
        t.join(60)
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    assert sorted(r.json()["changed"] for r in answers) == [False, False, False, True]
