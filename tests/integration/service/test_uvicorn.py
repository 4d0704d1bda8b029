"""``hps admin`` under real uvicorn: auth, readiness, and a 1 M-row upload in bounded memory."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hps.io.sparse_model import write_sparse_model
from tests.integration.service.conftest import TOKEN, AdminProcess, Stack
from tests.integration.service.helpers import triton_rows

pytestmark = pytest.mark.integration

UPLOAD_ROWS = 1_000_000
UPLOAD_DIM = 128  # 512 MB of vectors
# Peak private RSS growth of the admin process over the whole upload + import, for a 520 MB
# request. What it holds: RocksDB's memtables (2 x 64 MiB write buffers), one 8 MiB chunk of
# vectors in flight with its copies (validation, RocksDB's write batch), and at most 1 MiB of
# the upload gathered before a write; the upload itself streams to disk. Measured: about
# 240 MB.
MEMORY_BOUND_MB = 288


def _call(
    url: str, method: str = "GET", body: Any = None, token: str | None = None
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_auth_and_readiness(admin_process: AdminProcess, stack: Stack) -> None:
    url = admin_process.url
    assert _call(url + "/healthz") == (200, {"status": "ok"})
    status, body = _call(url + "/readyz")
    assert status == 200, body
    keys = stack.data["one.r"][0][:2].tolist()
    delete = url + "/v1/models/one/tables/r/keys"
    for token in (None, "wrong", TOKEN + "x"):
        status, body = _call(delete, "DELETE", {"keys": keys}, token)
        assert status == 401, body
        assert TOKEN not in json.dumps(body)
    status, body = _call(url + "/v1/models/one/tables/r/lookup", "POST", {"keys": keys}, TOKEN)
    assert status == 200 and [r["found_in"] for r in body["results"]] == ["l2", "l2"]
    status, body = _call(url + "/v1/config")
    assert status == 200 and body["models"][0]["model"] == "emb"
    with urllib.request.urlopen(url + "/metrics") as resp:
        assert b'hps_admin_requests_total{method="DELETE"' in resp.read()
    admin_process.proc.terminate()
    admin_process.proc.wait(20)
    assert TOKEN not in admin_process.log.read_text()


def _anon_mb(pid: int) -> float:
    """Private resident memory (RssAnon): the shared-memory L2 the import fills is not counted."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon")


class PeakMemory:
    """Polls a process's RssAnon every 20 ms in a thread; ``peak`` is the highest seen."""

    def __init__(self, pid: int) -> None:
        import threading

        self.pid = pid
        self.peak = _anon_mb(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.peak = max(self.peak, _anon_mb(self.pid))
            except (OSError, AssertionError):  # the process is gone (a failed test's teardown)
                return

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


def test_million_row_upload_in_bounded_memory(
    admin_process: AdminProcess, stack: Stack, tmp_path: Path
) -> None:
    """Multipart upload streamed to disk, validated and imported in chunks, then served."""
    import http.client
    import uuid

    rng = np.random.default_rng(3)
    keys = np.arange(UPLOAD_ROWS, dtype=np.int64) * 7 + 1
    write_sparse_model(
        tmp_path / "up", keys, rng.standard_normal((UPLOAD_ROWS, UPLOAD_DIM), dtype=np.float32)
    )
    pid = admin_process.proc.pid
    _call(admin_process.url + "/readyz")  # everything the routes import is loaded
    base = _anon_mb(pid)
    peak = PeakMemory(pid)
    boundary = uuid.uuid4().hex
    parts = [("format", None, b"sparse")]
    files = [("keys", tmp_path / "up" / "key"), ("vectors", tmp_path / "up" / "emb_vector")]
    head = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{n}"\r\n\r\n'.encode() + v + b"\r\n"
        for n, _, v in parts
    )
    pieces: list[bytes | Path] = [head]
    for name, path in files:
        pieces.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
            f'filename="{path.name}"\r\nContent-Type: application/octet-stream\r\n\r\n'.encode()
        )
        pieces += [path, b"\r\n"]
    pieces.append(f"--{boundary}--\r\n".encode())
    length = sum(p.stat().st_size if isinstance(p, Path) else len(p) for p in pieces)
    host, port = admin_process.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    start = time.perf_counter()
    conn.putrequest("POST", "/v1/models/big/tables/t/import")
    conn.putheader("Authorization", f"Bearer {TOKEN}")
    conn.putheader("Content-Type", f"multipart/form-data; boundary={boundary}")
    conn.putheader("Content-Length", str(length))
    conn.endheaders()
    for p in pieces:
        if isinstance(p, Path):
            with open(p, "rb") as f:
                while chunk := f.read(1 << 20):
                    conn.send(chunk)
        else:
            conn.send(p)
    resp = conn.getresponse()
    body = json.loads(resp.read())
    assert resp.status == 202, body
    deadline = time.monotonic() + 300
    while True:
        status, job = _call(f"{admin_process.url}/v1/jobs/{body['job']}")
        if job["state"] in ("done", "failed") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    elapsed = time.perf_counter() - start
    assert job["state"] == "done" and job["rows_done"] == UPLOAD_ROWS, job
    growth = peak.stop() - base
    print(
        f"1M-row upload: {elapsed:.1f}s, {job['rows_per_s']:.0f} rows/s written, "
        f"peak RSS growth {growth:.0f} MB (vectors {UPLOAD_ROWS * UPLOAD_DIM * 4 >> 20} MB)"
    )
    assert growth < MEMORY_BOUND_MB
    got = triton_rows(stack.server.http_url, "big", 1, 0, keys[[0, 123_456, -1]])
    assert got.shape == (3, UPLOAD_DIM) and not (got == 0.5).all(axis=1).any()
