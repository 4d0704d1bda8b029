"""Server-side paths of the import and warm-up routes are confined to the path roots (by
default the ps.json's folder and the state folder), against a real tritonserver; a warm-up
that finds no keys is a 400 and reloads nothing."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hps.io.frequency import write_frequency_file
from hps.io.keyset import write_keyset
from hps.io.sparse_model import write_sparse_model
from hps.service.app import create_app
from hps.service.schemas import MAX_WRITE_KEYS
from hps.service.state import AdminState
from hps.service.triton_admin import TritonAdmin
from tests.integration.service.conftest import TOKEN, AdminProcess, Stack
from tests.integration.service.helpers import stub_pids, triton_rows

pytestmark = pytest.mark.integration

FILE = "a readable file under the path roots"
FOLDER = "a folder under the path roots holding key and emb_vector"


def _refusal(given: str, what: str) -> dict[str, str]:
    return {"error": "RequestError", "detail": f"path not allowed or not found: {given!r} ({what})"}


@pytest.fixture
def inside(stack: Stack) -> Any:
    """A folder under the ps.json's folder (a default root), removed afterwards."""
    folder = stack.root / "confined"
    folder.mkdir()
    yield folder
    shutil.rmtree(folder)


def _outside_files(tmp_path: Path, inside: Path, keys: np.ndarray) -> list[str]:
    """Paths that name readable, well-formed files outside the roots, or nothing at all."""
    outside = tmp_path / "outside"
    outside.mkdir()
    write_keyset(outside / "hot.keyset", keys)
    write_frequency_file(outside / "hot.npz", keys, np.arange(keys.size))
    (inside / "link.keyset").symlink_to(outside / "hot.keyset")
    (inside / "link.npz").symlink_to(outside / "hot.npz")
    (inside / "outdir").symlink_to(outside)
    return [
        str(outside / "hot.keyset"),
        str(outside / "hot.npz"),
        str(inside / "link.keyset"),  # a link inside the roots, to a file outside
        str(inside / "link.npz"),
        str(inside / "outdir" / "hot.keyset"),  # through a linked folder
        str(inside / ".." / ".." / tmp_path.name / "outside" / "hot.keyset"),  # `..`
        str(outside / "missing.keyset"),
        str(inside / "missing.keyset"),  # missing inside: the same answer
        str(inside),  # a folder, not a file
        "/etc/passwd",
        "/proc/self/environ",
        "relative.keyset",
    ]


def test_warmup_paths_outside_the_roots_are_refused_alike(
    client: Any, stack: Stack, tmp_path: Path, inside: Path
) -> None:
    keys = stack.data["one.r"][0][:5]
    pids = stub_pids(stack.server.repository, "one")
    for given in _outside_files(tmp_path, inside, keys):
        for field in ("keyset_path", "frequency_path"):
            r = client.post("/v1/models/one/warmup", json={field: given})
            assert r.status_code == 400, (given, field, r.text)
            assert r.json() == _refusal(given, FILE), r.text  # nothing about the file itself
    assert stub_pids(stack.server.repository, "one") == pids  # nothing was reloaded


def test_warmup_of_no_keys_is_refused_and_reloads_nothing(
    client: Any, stack: Stack, inside: Path
) -> None:
    write_keyset(inside / "empty.keyset", np.empty(0, dtype=np.int64))
    write_frequency_file(inside / "empty.npz", np.empty(0, np.int64), np.empty(0, np.int64))
    pids = stub_pids(stack.server.repository, "one")
    written = stack.root / "admin" / "warmup" / "one" / "r.keyset"
    before = written.stat().st_mtime_ns if written.exists() else None
    for body in (
        {"keyset_path": str(inside / "empty.keyset")},
        {"frequency_path": str(inside / "empty.npz"), "top_k": 10},
        {"frequency_path": str(inside / "empty.npz"), "table": "r"},
    ):
        r = client.post("/v1/models/one/warmup", json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"] == "RequestError", r.text
        assert r.json()["detail"].startswith("warm-up of model 'one' found no keys"), r.text
    assert stub_pids(stack.server.repository, "one") == pids
    assert (written.stat().st_mtime_ns if written.exists() else None) == before


def test_warmup_files_beyond_the_key_limit_are_refused_before_they_are_read(
    client: Any, stack: Stack, inside: Path
) -> None:
    write_keyset(inside / "big.keyset", np.arange(MAX_WRITE_KEYS + 1, dtype=np.int64))
    pids = stub_pids(stack.server.repository, "one")
    r = client.post("/v1/models/one/warmup", json={"keyset_path": str(inside / "big.keyset")})
    assert r.status_code == 413, r.text
    assert r.json()["error"] == "BatchTooLargeError", r.text
    assert r.json()["detail"].endswith("1,000,001 keys, more than the 1,000,000 allowed"), r.text
    body = {"frequency_path": str(inside / "big.npz"), "top_k": MAX_WRITE_KEYS + 1}
    assert client.post("/v1/models/one/warmup", json=body).status_code == 422
    assert stub_pids(stack.server.repository, "one") == pids


def test_import_paths_outside_the_roots_are_refused_alike(
    client: Any, stack: Stack, tmp_path: Path, inside: Path
) -> None:
    keys = np.arange(30_000_000, 30_000_050, dtype=np.int64)
    vectors = np.random.default_rng(3).standard_normal((keys.size, 8), dtype=np.float32)
    write_sparse_model(tmp_path / "outside", keys, vectors)
    (inside / "linked").symlink_to(tmp_path / "outside")
    mixed = inside / "mixed"  # a real folder whose emb_vector leads outside
    mixed.mkdir()
    shutil.copy(tmp_path / "outside" / "key", mixed / "key")
    (mixed / "emb_vector").symlink_to(tmp_path / "outside" / "emb_vector")
    half = inside / "half"  # inside, but emb_vector is missing
    half.mkdir()
    shutil.copy(tmp_path / "outside" / "key", half / "key")
    for given in (
        str(tmp_path / "outside"),
        str(inside / "linked"),
        str(mixed),
        str(half),
        str(inside / "missing"),
        str(inside / ".." / ".." / tmp_path.name / "outside"),
        "/etc",
        "/",
    ):
        r = client.post("/v1/models/emb/tables/b/import", data={"format": "sparse", "path": given})
        assert r.status_code == 400, (given, r.text)
        assert r.json() == _refusal(given, FOLDER), r.text
    found = client.post("/v1/models/emb/tables/b/lookup", json={"keys": keys[:3].tolist()})
    assert [x["found_in"] for x in found.json()["results"]] == ["default"] * 3
    # the same files inside the roots import, and Triton serves them
    shutil.copytree(tmp_path / "outside", inside / "model")
    r = client.post(
        "/v1/models/emb/tables/b/import",
        data={"format": "sparse", "path": str(inside / "model")},
    )
    assert r.status_code == 202, r.text
    job = _wait_job(client, r.json()["job"])
    assert job["state"] == "done" and job["rows_done"] == 50, job
    np.testing.assert_allclose(
        triton_rows(stack.server.http_url, "emb", 2, 1, keys[:4]), vectors[:4]
    )


def test_configured_roots_replace_the_defaults(stack: Stack, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from hps.config import AdminConfig

    root = tmp_path / "warm"
    root.mkdir()
    keys = stack.data["one.r"][0][:6]
    write_keyset(root / "hot.keyset", keys)
    write_keyset(stack.root / "hot.keyset", keys)  # under a default root, not a configured one
    config = stack.config.model_copy(update={"hps_admin": AdminConfig(path_roots=[str(root)])})
    triton = TritonAdmin(stack.server.http_url, stack.server.metrics_url, stack.server.admin_key)
    state = AdminState(config, TOKEN, triton, state_dir=stack.root / "admin")
    try:
        with TestClient(create_app(state)) as c:
            c.headers["Authorization"] = f"Bearer {TOKEN}"
            given = str(stack.root / "hot.keyset")
            r = c.post("/v1/models/one/warmup", json={"keyset_path": given})
            assert r.status_code == 400 and r.json() == _refusal(given, FILE), r.text
            r = c.post("/v1/models/one/warmup", json={"keyset_path": str(root / "hot.keyset")})
            assert r.status_code == 200, r.text
            assert r.json()["keys"] == {"r": 6}
            assert c.get("/v1/config").json()["hps_admin"] == {"path_roots": [str(root)]}
    finally:
        (stack.root / "hot.keyset").unlink()


def test_hps_admin_under_uvicorn_says_nothing_of_files_outside(
    admin_process: AdminProcess,
) -> None:
    answers = {}
    for given in ("/etc/passwd", "/etc/no-such-file", "/etc", "/proc/self/cmdline"):
        answers[given] = _post(admin_process.url + "/v1/models/one/warmup", {"keyset_path": given})
    for given, (status, body) in answers.items():
        assert status == 400 and body == _refusal(given, FILE), (given, body)


def _post(url: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", f"Bearer {TOKEN}")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _wait_job(client: Any, job_id: str, timeout: float = 120) -> dict[str, Any]:
    import time

    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in ("done", "failed") or time.monotonic() > deadline:
            return job
        time.sleep(0.1)
