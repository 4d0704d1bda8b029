"""What the control plane answers hostile or careless clients, through the real application:
error bodies that echo a client's text whatever it guessed, 413/408 on JSON routes, the
version import's body limit, a client leaving mid-upload, upload errors naming form fields,
unknown jobs, and keys and versions that must be JSON integers."""

from __future__ import annotations

import io
import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from starlette.requests import Request

from hps import redact
from hps.service.app import _error, create_app
from hps.service.connections import ConnectionGuard
from hps.service.limits import LOOKUP_JSON_BYTES, VERSION_JSON_BYTES
from hps.service.state import AdminState
from hps.service.triton_admin import TritonAdmin
from hps.triton.serving import prepare_tables, serving_config
from tests.unit.commands.conftest import write_ps_json
from tests.unit.service.test_jobs_and_limits import HANG_S, _serving

TOKEN = "answers-token-0123456789"
SECRET = "redis-password-4f9c2a7e1b"  # registered as the config's password would be
WRONG = [f"guess-{i:04d}-abcdefghij" for i in range(200)]


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(redact, "_values", set())
    redact.register(SECRET, TOKEN)
    return SECRET


@pytest.fixture
def state(tmp_path: Path) -> AdminState:
    config = serving_config(write_ps_json(tmp_path))
    prepare_tables(config)
    return AdminState(config, TOKEN, TritonAdmin("127.0.0.1:1"), state_dir=tmp_path / "admin")


@pytest.fixture
def client(state: AdminState) -> Iterator[TestClient]:
    with TestClient(create_app(state)) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield client


# -- no oracle of secrets ----------------------------------------------------------------


def test_an_echoed_guess_reads_the_same_whether_or_not_it_is_a_secret(
    secret: str, client: TestClient
) -> None:
    """Where `<redacted>` appeared in an echo told which of a request's guesses is a secret:
    the answer to guesses holding it and to guesses that do not have the same form."""
    with_secret = "-".join([*WRONG[:100], secret, *WRONG[100:]])
    only_wrong = "-".join([*WRONG[:100], WRONG[0], *WRONG[100:]])
    for name in (with_secret, only_wrong):
        r = client.get(f"/v1/models/{name}")
        assert r.status_code == 404
        detail = f"unknown model {name!r}; configured: ['demo']"
        assert r.json() == {"error": "UnknownTableError", "detail": detail}
        r = client.get(f"/v1/models/demo/tables/{name}")
        assert r.status_code == 404 and redact.REDACTED not in r.text
        assert name in r.json()["detail"]
        r = client.get(f"/v1/jobs/{name}")
        assert r.status_code == 404 and r.json()["detail"] == f"no job {name!r}"


def test_an_echoed_json_key_or_form_field_is_the_client_s_own(
    secret: str, client: TestClient
) -> None:
    """A body's strings (keys too, however the JSON escapes them) and a form's text."""
    escaped = "".join(f"\\u{ord(c):04x}" for c in secret)
    for sent, key in ((secret, secret), (escaped, secret), (WRONG[0], WRONG[0])):
        body = '{"keys": [1], "' + sent + '": 1}'
        r = client.post("/v1/models/demo/tables/t0/lookup", content=body,
                        headers={"Content-Type": "application/json"})  # fmt: skip
        assert r.status_code == 422
        extra = {"loc": ["body", key], "msg": "Extra inputs are not permitted"}
        assert r.json()["detail"] == [extra]
    for path in (f"/nowhere/{secret}", f"/nowhere/{WRONG[0]}"):
        r = client.post("/v1/models/demo/tables/t0/import", data={"format": "npy", "path": path})
        assert r.status_code == 400 and redact.REDACTED not in r.text
        assert f"path not allowed or not found: {path!r}" in r.json()["detail"]


def _request(path: str) -> Request:
    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": []}  # fmt: skip
    return Request(scope)


def test_a_secret_the_server_says_is_still_redacted(secret: str) -> None:
    """Only what the request carried is kept: a secret from the server's side (a backend's
    error text) is scrubbed, beside an echo of the client's."""
    detail = f"redis://:{secret}@l2:6379 refused; model '{WRONG[0]}'"
    body = json.loads(_error(_request(f"/v1/models/{WRONG[0]}"), 502, "BackendError", detail).body)
    assert body["detail"] == f"redis://:<redacted>@l2:6379 refused; model '{WRONG[0]}'"
    sent = _request(f"/v1/models/{secret}")
    body = json.loads(_error(sent, 502, "BackendError", f"{secret} {TOKEN}").body)
    assert body["detail"] == f"{secret} <redacted>"  # the token was not in the request


# -- body limits of JSON routes, through uvicorn -------------------------------------------


def _exchange(address: str, head: bytes, body: bytes = b"") -> bytes:
    """Send a request (it may stall after ``body``) and read the answer to the close."""
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=HANG_S) as s:
        s.sendall(head + body)
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except ConnectionResetError:  # aborted once answered
            pass
    return answer


def _head(path: str, extra: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\n{extra}\r\n").encode()  # fmt: skip


def test_a_json_route_answers_413_and_408_not_400(state: AdminState) -> None:
    """FastAPI made any error of a body read a 400: a chunked lookup past its limit, and a
    body that stops short of its Content-Length, are the documented 413 and 408."""
    guard = ConnectionGuard(8, read_timeout_s=0.5)
    keys = b"1," * (LOOKUP_JSON_BYTES // 2)
    big = b'{"keys": [' + keys + b"1]}"
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in
                      (big[i : i + 65536] for i in range(0, len(big), 65536)))  # fmt: skip
    lookup = "/v1/models/demo/tables/t0/lookup"
    with _serving(create_app(state, guard), guard) as (address, _):
        answer = _exchange(address, _head(lookup, "Transfer-Encoding: chunked\r\n"),
                           chunks + b"0\r\n\r\n")  # fmt: skip
        assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
        assert b'"error":"TooLarge"' in answer and b"at most 10,000 keys" in answer
        small = b'{"keys": [1]}'
        answer = _exchange(address, _head(lookup, f"Content-Length: {len(small) + 100}\r\n"), small)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
        assert b'{"error":"BodyTimeout","detail":"request body ' in answer


def test_a_version_import_body_is_limited_and_its_lists_counted_first(client: TestClient) -> None:
    r = client.post("/v1/models/demo/versions", content=b" " * (VERSION_JSON_BYTES + 1),
                    headers={"Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == 413 and "one version import" in r.json()["detail"]
    # too many items: one error, the items not looked at (each would be an error here)
    for field in ("dims", "row_dtype"):
        r = client.post("/v1/models/demo/versions", json={"version": 2, field: [None] * 5000})
        assert r.status_code == 422, r.text
        assert r.json()["detail"] == [
            {"loc": ["body", field], "msg": "List should have at most 1024 items, not 5000"}
        ]


# -- a client that leaves mid-upload -------------------------------------------------------


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_client_that_leaves_mid_upload_costs_no_error_line(state: AdminState) -> None:
    guard = ConnectionGuard(8, read_timeout_s=30.0)
    records = _Records()
    loggers = [logging.getLogger(n) for n in ("", "uvicorn", "uvicorn.error", "hps")]
    before = logging.getLogger("hps.service.limits").level
    logging.getLogger("hps.service.limits").setLevel(logging.DEBUG)
    with _serving(create_app(state, guard), guard) as (address, _):
        for logger in loggers:  # after uvicorn configured its loggers
            logger.addHandler(records)
        try:
            host, port = address.split(":")
            with socket.create_connection((host, int(port)), timeout=HANG_S) as s:
                s.sendall(b"POST /v1/models/demo/tables/t0/import HTTP/1.1\r\nHost: x\r\n"
                          b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
                          b"Content-Type: multipart/form-data; boundary=b\r\n"
                          b"Content-Length: 100000\r\n\r\n--b\r\n"
                          b'Content-Disposition: form-data; name="keys"; filename="k"\r\n\r\n'
                          + b"x" * 1000)  # fmt: skip
                time.sleep(0.2)  # the route is reading the body
            deadline = time.monotonic() + HANG_S
            while not any("the client left" in r.getMessage() for r in records.records):
                assert time.monotonic() < deadline, [r.getMessage() for r in records.records]
                time.sleep(0.02)
            # the server's own handling of the end of the request, whatever it logs, is done
            with socket.create_connection((host, int(port)), timeout=HANG_S) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert s.recv(100).startswith(b"HTTP/1.1 200")
        finally:
            for logger in loggers:
                logger.removeHandler(records)
            logging.getLogger("hps.service.limits").setLevel(before)
    errors = [r for r in records.records if r.levelno >= logging.WARNING]
    assert not errors, [r.getMessage() for r in errors]
    assert not list(state.uploads_dir.iterdir())
    assert state.jobs.load() == (0, 0)


# -- upload errors, unknown jobs, integers ---------------------------------------------------


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def test_an_upload_error_names_the_form_field_not_the_staging_path(client: TestClient) -> None:
    keys = _npy(np.arange(5, dtype=np.int64))
    for vectors, field, says in [
        (np.zeros((4, 4), np.float32), "keys", "5 keys but 4 vectors"),
        (np.zeros((5, 3), np.float32), "vectors", "vectors must be float (n, 4)"),
    ]:
        files = {"keys": ("k.npy", keys), "vectors": ("v.npy", _npy(vectors))}
        r = client.post("/v1/models/demo/tables/t0/import", data={"format": "npy"}, files=files)
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert detail.startswith(f"demo.t0: `{field}`: ") and says in detail, detail
        assert "uploads" not in detail and "hps-admin" not in detail and "/" not in detail


def test_an_unknown_job_is_an_unknown_job(client: TestClient) -> None:
    r = client.get("/v1/jobs/abc")
    assert r.status_code == 404
    assert r.json() == {"error": "UnknownJobError", "detail": "no job 'abc'"}
