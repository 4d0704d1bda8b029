"""Model versions through the control plane: `hps admin` under real uvicorn beside a real
`hps serve` (tritonserver) of the demo (two tables of dim 16, and its CTR model).

Every vector of version v of key k is ``[k, v, table, 0, ...]``, so an answer shows the
version it came from. Import version 2 through the API (a job) -> listed ready, nothing
served changes; activate it -> `/v2/models/demo/infer` answers with Triton's
``model_version`` "2" and version 2's vectors, version 1 still answers when pinned, the
control plane's own lookup reads version 2; roll back (activate 1) -> version 1 again;
a delete through the control plane reaches the live version only; `hps versions list` and
`hps versions activate` (a rollback the control plane follows) on the same node; retire
version 2, now neither live nor served; 401 without the token; 404 and 409 cases.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hps.net import free_port
from tests.fixtures.versions import write_encoded_version
from tests.helpers import launch_admin, stop_by_pid, wait_for_banner
from tests.integration.triton.test_serve_cli import run_hps
from tests.integration.triton.test_serve_lifecycle import serve, stop

pytestmark = pytest.mark.integration

TOKEN = "versions-admin-token"
ROWS, DIM, TABLES = 200, 16, ("C1", "C2")
KEYS = np.array([3, 1, 4, 1, 5, 9], np.int64)  # 3 keys of C1, then 3 of C2


def write_version(folder: Path, version: int) -> list[str]:
    """Both tables as version ``version`` encodes them; their folders."""
    return write_encoded_version(folder, version, rows=ROWS, dim=DIM, tables=TABLES)


def expected(version: int) -> np.ndarray:
    want = np.zeros((KEYS.size, DIM), np.float32)
    want[:, 0], want[:, 1], want[:, 2] = KEYS, version, np.repeat([0, 1], 3)
    return want


@dataclass
class Node:
    site: Path
    triton: str  # hps serve's Triton HTTP address
    admin: str  # the control plane's base URL

    def call(self, method: str, path: str, body: Any = None, token: str | None = TOKEN) -> Any:
        """(status, JSON body) of a control-plane request."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.admin + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=300) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def infer(self, version: str = "") -> tuple[str, np.ndarray]:
        """(Triton's model_version of the answer, its rows) for KEYS through hps serve."""
        import tritonclient.http as httpclient

        with httpclient.InferenceServerClient(self.triton) as client:
            k = httpclient.InferInput("KEYS", [1, KEYS.size], "INT64")
            k.set_data_from_numpy(KEYS.reshape(1, -1))
            n = httpclient.InferInput("NUMKEYS", [1, 2], "INT32")
            n.set_data_from_numpy(np.array([[3, 3]], np.int32))
            result = client.infer("demo", [k, n], model_version=version)
        rows = result.as_numpy("OUTPUT0").reshape(-1, DIM)
        return str(result.get_response()["model_version"]), rows

    def hps(self, *args: str) -> list[str]:
        """Lines an `hps` command run in the site prints."""
        return run_hps(*args, cwd=self.site)

    def job(self, job_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            status, view = self.call("GET", f"/v1/jobs/{job_id}")
            assert status == 200, view
            if view["state"] not in ("queued", "running"):
                return dict(view)
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} still pending")


def start_admin(site: Path, triton: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``hps admin`` of the demo in ``site``, its token in a file."""
    token_file = site / "admin.token"
    token_file.write_text(TOKEN + "\n")
    env = {**os.environ}
    env.pop("HPS_ADMIN_TOKEN", None)
    args = ["--config", "demo/ps.json", "--triton-url", triton, "--token-file", str(token_file)]
    return launch_admin(args, log, cwd=site, env=env)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    run_hps("demo", "--dir", "demo", "--tables", "2", "--rows", str(ROWS), cwd=tmp_path)
    write_version(tmp_path / "demo" / "tables", 1)  # version 1: what the ps.json names
    (tmp_path / "tmp").mkdir()
    http = free_port()
    served = serve(tmp_path, http)
    admin = None
    try:
        wait_for_banner(served, timeout=180)
        admin, url = start_admin(tmp_path, f"127.0.0.1:{http}", tmp_path / "admin.log")
        yield Node(tmp_path, f"127.0.0.1:{http}", url)
    finally:
        if admin is not None:
            stop_by_pid(admin)
        served.send_signal(signal.SIGTERM)
        try:
            served.wait(60)
        except subprocess.TimeoutExpired:
            stop(served)


def test_import_activate_roll_back_and_retire_through_the_api(node: Node) -> None:
    status, listed = node.call("GET", "/v1/models/demo/versions")
    assert status == 200 and listed["live"] == 1, listed
    v2 = write_version(node.site / "demo" / "v2", 2)  # under the path roots (ps.json's folder)
    body = {"version": 2, "sparse_files": v2}
    for token in (None, "wrong"):
        assert node.call("POST", "/v1/models/demo/versions", body, token)[0] == 401
        assert node.call("POST", "/v1/models/demo/versions/1/activate", None, token)[0] == 401
        assert node.call("DELETE", "/v1/models/demo/versions/1", None, token)[0] == 401

    status, queued = node.call("POST", "/v1/models/demo/versions", body)
    assert status == 202 and queued["rows"] == 2 * ROWS, queued
    job = node.job(queued["job"])
    assert job["state"] == "done", job
    status, listed = node.call("GET", "/v1/models/demo/versions")
    states = {v["version"]: (v["state"], v["served"]) for v in listed["versions"]}
    assert states == {1: ("live", True), 2: ("ready", False)}, listed
    assert listed["versions"][1]["rows"]["l3"] == 2 * ROWS
    one, two = node.hps("versions", "list", "--config", "demo/ps.json", "--model", "demo")
    assert one.split()[1:4] == ["1", "live", "served"] and two.split()[1:3] == ["2", "ready"]
    version, rows = node.infer()
    assert version == "1"  # imported beside: nothing served changed
    np.testing.assert_array_equal(rows, expected(1))

    status, done = node.call("POST", "/v1/models/demo/versions/2/activate")
    assert status == 200, done
    assert (done["live"], done["previous"], done["served"], done["retired"]) == (2, 1, [1, 2], [])
    version, rows = node.infer()
    assert version == "2"
    np.testing.assert_array_equal(rows, expected(2))
    version, rows = node.infer("1")  # pinned: kept for rollback, still served
    assert version == "1"
    np.testing.assert_array_equal(rows, expected(1))
    # the control plane's table routes act on the live version
    status, found = node.call("POST", "/v1/models/demo/tables/C1/lookup", {"keys": [3, 1]})
    assert status == 200, found
    assert [r["vector"][:3] for r in found["results"]] == [[3, 2, 0], [1, 2, 0]]
    status, ready = node.call("GET", "/readyz")
    assert status == 200, json.dumps(ready, indent=1)
    # a delete reaches the live version only: a client pinned to version 1 still reads it
    status, deleted = node.call("DELETE", "/v1/models/demo/tables/C2/keys", {"keys": [9]})
    assert status == 200, deleted
    version, rows = node.infer()
    want = expected(2)
    want[-1] = 0.0  # the demo's default vector
    assert version == "2"
    np.testing.assert_array_equal(rows, want)
    np.testing.assert_array_equal(node.infer("1")[1], expected(1))

    for path, status_want, says in [
        ("/v1/models/demo/versions/2", 409, "is live"),
        ("/v1/models/demo/versions/1", 409, "is served"),
        ("/v1/models/demo/versions/7", 404, "has no version 7"),
    ]:
        status, err = node.call("DELETE", path)
        assert status == status_want and says in err["detail"], err
    status, err = node.call("POST", "/v1/models/demo/versions/7/activate")
    assert status == 404 and "has no version 7" in err["detail"], err
    status, err = node.call("POST", "/v1/models/demo/versions", body)
    assert status == 409 and "version 2 exists (live)" in err["detail"], err

    # roll back with the CLI: the control plane follows what the node records live
    (line,) = node.hps(
        "versions",
        "activate",
        "--config",
        "demo/ps.json",
        "--model",
        "demo",
        "1",
        "--url",
        node.triton,
    )
    assert line == "demo: version 1 live (was 2); Triton serves 1; retired: none"
    assert node.infer()[0] == "1"
    status, found = node.call("POST", "/v1/models/demo/tables/C1/lookup", {"keys": [3]})
    assert found["results"][0]["vector"][:3] == [3, 1, 0]
    status, done = node.call("POST", "/v1/models/demo/versions/2/activate")  # no import
    assert status == 200 and done["previous"] == 1, done
    assert node.infer()[0] == "2"

    status, done = node.call("POST", "/v1/models/demo/versions/1/activate")  # roll back
    assert status == 200, done
    assert (done["live"], done["previous"], done["served"]) == (1, 2, [1])
    version, rows = node.infer()
    assert version == "1"
    np.testing.assert_array_equal(rows, expected(1))
    status, found = node.call("POST", "/v1/models/demo/tables/C1/lookup", {"keys": [3]})
    assert found["results"][0]["vector"][:3] == [3, 1, 0]

    status, retired = node.call("DELETE", "/v1/models/demo/versions/2")  # neither live nor served
    assert status == 200 and retired["changed"] is True, retired
    status, listed = node.call("GET", "/v1/models/demo/versions")
    assert [(v["version"], v["state"]) for v in listed["versions"]] == [(1, "live"), (2, "retired")]
    status, err = node.call("POST", "/v1/models/demo/versions/2/activate")
    assert status == 409 and "is retired, not ready" in err["detail"], err
    version, _ = node.infer()
    assert version == "1"
    status, ready = node.call("GET", "/readyz")
    assert status == 200, json.dumps(ready, indent=1)
