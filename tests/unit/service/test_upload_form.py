"""An import's multipart body (hps.service.upload_form through the real app): file parts
written straight into the staging folder (never spooled to a temporary file first), bad
forms refused with what is wrong and nothing left staged, a chunked upload held to the
job queue's staged-bytes budget as it arrives (real RocksDB files)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import starlette.formparsers
from fastapi.testclient import TestClient
from starlette.requests import Request
from starlette.types import Message, Scope

from hps.errors import QueueFullError
from hps.io.sparse_model import write_sparse_model
from hps.service import upload_form
from hps.service.app import create_app
from hps.service.jobs import JobRegistry
from hps.service.state import AdminState
from hps.service.triton_admin import TritonAdmin
from tests.helpers import make_config, rows

TOKEN = "upload-form-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
URL = "/v1/models/demo/tables/t0/import"
HANG_S = 30.0  # hang guards only


def _state(tmp_path: Path, jobs: JobRegistry | None = None) -> AdminState:
    extra = {"jobs": jobs} if jobs is not None else {}
    return AdminState(make_config(tmp_path), TOKEN, TritonAdmin("127.0.0.1:1"),
                      state_dir=tmp_path / "s", **extra)  # fmt: skip


def _ended(client: TestClient, job: str) -> dict[str, Any]:
    deadline = time.monotonic() + HANG_S
    while True:
        view: dict[str, Any] = client.get(f"/v1/jobs/{job}").json()
        if view["state"] not in ("queued", "running"):
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.02)


def _files(tmp_path: Path, n: int = 10) -> tuple[bytes, bytes]:
    keys = np.arange(1, n + 1, dtype=np.int64)
    folder = tmp_path / "src"
    write_sparse_model(folder, keys, rows(keys, 4))
    return (folder / "key").read_bytes(), (folder / "emb_vector").read_bytes()


def _body(boundary: str, parts: list[tuple[str, str | None, bytes]], close: bool = True) -> bytes:
    """A multipart body of (field, filename or None for text, content) parts."""
    out = b""
    for name, filename, content in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
        out += content + b"\r\n"
    return out + (f"--{boundary}--\r\n".encode() if close else b"")


def _post(client: TestClient, body: bytes, boundary: str = "b0undary") -> tuple[int, str]:
    headers = {**AUTH, "Content-Type": f"multipart/form-data; boundary={boundary}"}
    answer = client.post(URL, content=body, headers=headers)
    return answer.status_code, answer.text


def test_an_upload_is_written_to_its_staging_folder_and_never_spooled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_spool(*args: object, **kwargs: object) -> None:
        raise AssertionError("an upload was spooled to a temporary file")

    monkeypatch.setattr(starlette.formparsers, "SpooledTemporaryFile", no_spool)
    key, vectors = _files(tmp_path)
    state = _state(tmp_path)
    with TestClient(create_app(state)) as client:
        # the format after the files: the files are named once the form has ended
        body = _body("b0undary", [("keys", "key", key), ("vectors", "v", vectors),
                                  ("format", None, b"sparse")])  # fmt: skip
        status, text = _post(client, body)
        assert status == 202, text
        view = _ended(client, json.loads(text)["job"])
        assert view["state"] == "done" and view["rows_done"] == 10, view
        got = client.post("/v1/models/demo/tables/t0/lookup", headers=AUTH,
                          json={"keys": [1, 10]}).json()  # fmt: skip
    keys = np.array([1, 10], dtype=np.int64)
    assert [r["vector"] for r in got["results"]] == rows(keys, 4).tolist()
    assert not list(state.uploads_dir.glob("*"))  # the staged folder went with its job


def test_a_url_encoded_form_names_a_server_path(tmp_path: Path) -> None:
    state = _state(tmp_path)
    folder = tmp_path / "s" / "data"  # under the path roots (the state folder)
    keys = np.arange(1, 6, dtype=np.int64)
    write_sparse_model(folder, keys, rows(keys, 4))
    with TestClient(create_app(state)) as client:
        answer = client.post(URL, headers=AUTH, data={"format": "sparse", "path": str(folder)})
        assert answer.status_code == 202, answer.text
        assert _ended(client, answer.json()["job"])["state"] == "done"
        refused = [
            ({"format": "sparse", "keys": "x"}, "`keys` must be a file part"),
            ({"format": "sparse", "what": "x"}, "unknown form field 'what'"),
            ({"format": "sparse", "path": "p" * 70_000}, "over 65,536 bytes"),
        ]
        for data, says in refused:
            answer = client.post(URL, headers=AUTH, data=data)
            assert answer.status_code == 422 and says in answer.text, answer.text


def test_bad_forms_are_refused_and_leave_nothing_staged(tmp_path: Path) -> None:
    key, vectors = _files(tmp_path)
    state = _state(tmp_path)
    files = [("keys", "key", key), ("vectors", "emb_vector", vectors)]
    cases = [
        (_body("b", [("format", None, b"sparse"), *files], close=False), 422, "closing boundary"),
        (_body("b", [("format", None, b"sparse"), ("extra", None, b"1"), *files]), 422,
         "unknown form field 'extra'"),
        (_body("b", [("format", None, b"sparse"), ("format", None, b"npy"), *files]), 422,
         "`format` is given twice"),
        (_body("b", [("format", "f.txt", b"sparse"), *files]), 422, "`format` must be text"),
        (_body("b", [("format", None, b"sparse"), ("keys", None, key), files[1]]), 422,
         "`keys` must be a file part"),
        (_body("b", [("format", None, b"csv"), *files]), 422, "`sparse` or `npy`"),
        (_body("b", [("format", None, b"sparse"), files[0]]), 400, "keys and vectors"),
        (_body("b", [("format", None, b"sparse"), ("path", None, b"/x"), *files]), 400,
         "not both"),
        (_body("b", [("format", None, b"sparse"), ("keys", "key", key),
                     ("vectors", "emb_vector", vectors[:-3])]), 422, "`vectors`: "),
        (b"--b\r\nContent-Disposition: form-data\r\n\r\nx\r\n--b--\r\n", 422, "name="),
        (b"garbage", 422, "invalid multipart body"),
    ]  # fmt: skip
    with TestClient(create_app(state)) as client:
        for body, status, says in cases:
            got, text = _post(client, body, "b")
            assert (got, says in text) == (status, True), (says, got, text)
        answer = client.post(URL, headers=AUTH, json={"format": "sparse"})
        assert answer.status_code == 422 and "multipart/form-data" in answer.text
        assert client.get("/v1/jobs").json().get("pending", 0) == 0
    assert not list(state.uploads_dir.glob("*")), list(state.uploads_dir.iterdir())


def test_a_chunked_upload_is_refused_once_it_passes_the_staged_budget(tmp_path: Path) -> None:
    """No Content-Length: it reserves 0, grows as it arrives, and gets 429 once its bytes and
    the pending ones (here another upload's reservation) pass --max-staged-gb; what it had
    written is removed. Alone, it is admitted."""
    key, vectors = _files(tmp_path, n=1000)  # 8 kB of keys, 16 kB of vectors
    jobs = JobRegistry(max_jobs=4, max_staged_bytes=40_000)
    state = _state(tmp_path, jobs)
    boundary = uuid.uuid4().hex
    body = _body(boundary, [("format", None, b"sparse"), ("keys", "key", key),
                            ("vectors", "emb_vector", vectors)])  # fmt: skip

    def chunked() -> Iterator[bytes]:
        for i in range(0, len(body), 4096):
            yield body[i : i + 4096]

    headers = {**AUTH, "Content-Type": f"multipart/form-data; boundary={boundary}"}
    with TestClient(create_app(state)) as client:
        with jobs.reserved(20_000):  # another upload under way
            answer = client.post(URL, content=chunked(), headers=headers)
            assert answer.status_code == 429, answer.text
            assert "bytes so far pass the limit of 40000" in answer.json()["detail"]
            assert int(answer.headers["retry-after"]) >= 1
            assert not list(state.uploads_dir.glob("*"))
            assert jobs.load() == (1, 20_000)
        answer = client.post(URL, content=chunked(), headers=headers)
        assert answer.status_code == 202, answer.text
        assert _ended(client, answer.json()["job"])["state"] == "done"


def test_a_body_that_fails_part_way_leaves_nothing_of_what_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files written as the body arrived are removed when it stops (the queue's 429 as
    the upload grows, a client gone)."""
    monkeypatch.setattr(upload_form, "WRITE_BYTES", 1024)  # written as it arrives
    key, vectors = _files(tmp_path, n=1000)
    body = _body("b", [("format", None, b"sparse"), ("keys", "key", key),
                       ("vectors", "emb_vector", vectors)])  # fmt: skip
    folder = tmp_path / "staged"
    chunks = [body[i : i + 4096] for i in range(0, len(body), 4096)]
    written: list[int] = []

    async def receive() -> Message:
        written.append(sum(f.stat().st_size for f in folder.glob("*")))
        if len(written) > len(chunks) - 2:
            raise QueueFullError("past the budget", 5)
        return {"type": "http.request", "body": chunks[len(written) - 1], "more_body": True}

    scope: Scope = {"type": "http", "method": "POST", "path": URL, "headers": [
        (b"content-type", b"multipart/form-data; boundary=b")]}  # fmt: skip
    request = Request(scope, receive)
    names = (frozenset({"format", "path"}), frozenset({"keys", "vectors"}))
    with pytest.raises(QueueFullError):
        anyio.run(upload_form.receive, request, folder, *names)
    assert max(written) > 8_000  # the keys file and part of the vectors were on disk
    assert not folder.exists()


def test_a_full_disk_while_staging_is_a_503_and_leaves_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upload_form, "WRITE_BYTES", 1024)
    flush = upload_form._Receiver.flush
    calls: list[int] = []

    def fills_the_disk(self: upload_form._Receiver) -> None:
        calls.append(1)
        if len(calls) == 2:  # the first wrote what had come
            raise OSError(28, "No space left on device")
        flush(self)

    monkeypatch.setattr(upload_form._Receiver, "flush", fills_the_disk)
    key, vectors = _files(tmp_path, n=1000)
    state = _state(tmp_path)
    body = _body("b", [("format", None, b"sparse"), ("keys", "key", key),
                       ("vectors", "emb_vector", vectors)])  # fmt: skip
    with TestClient(create_app(state)) as client:
        status, text = _post(client, body, "b")
    assert status == 503 and "could not be staged: No space left on device" in text, text
    assert len(calls) == 2 and not list(state.uploads_dir.glob("*"))
