"""``hps admin`` under abuse, on real uvicorn and tritonserver: a flood of half-open
connections past the file-descriptor limit, an import queue past its bounds, a SIGTERM with
jobs queued and a restart, concurrent reloads and warm-ups."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hps.io.sparse_model import write_sparse_model
from hps.loading.imports import import_lock
from hps.topology import topology
from tests.helpers import running_admin
from tests.integration.service.conftest import TOKEN, Stack

pytestmark = pytest.mark.integration

HANG_S = 60.0  # hang guards only: no test asserts a duration
FD_LIMIT = 1024
FLOOD = 3000  # half-open connections: about three times the descriptor limit


@contextmanager
def admin(
    stack: Stack, tmp_path: Path, *extra: str, fd_limit: int | None = None, log_name: str = "admin"
) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """``hps admin`` with ``extra`` options; stopped by its PID (SIGTERM, then SIGKILL)."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    log = tmp_path / f"{log_name}.log"
    env = {**os.environ, "HPS_TRITON_METRICS_URL": stack.server.metrics_url}
    env["HPS_ADMIN_KEY"] = stack.server.admin_key or ""
    env.pop("HPS_ADMIN_TOKEN", None)
    args = [
        "--config", str(stack.root / "ps.json"), "--triton-url", stack.server.http_url,
        "--token-file", str(token_file), *extra,
    ]  # fmt: skip

    def limit() -> None:
        if fd_limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    started = running_admin(args, log, env=env, preexec_fn=limit, start_s=HANG_S, stop_s=HANG_S)
    with started as (url, proc):
        yield url, proc, log


def _get(url: str, token: str | None = None) -> tuple[int, Any, float]:
    """(status, body, seconds) of a GET."""
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=HANG_S) as resp:
            return resp.status, json.loads(resp.read()), time.perf_counter() - start
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null"), time.perf_counter() - start


def test_health_answers_under_a_half_open_flood(stack: Stack, tmp_path: Path) -> None:
    """3,000 connections that never send a byte against a 1,024-descriptor process: the
    oldest idle ones are closed, accept never runs out, /healthz and /readyz answer and the
    log stays small."""
    with admin(stack, tmp_path, "--max-connections", "200", fd_limit=FD_LIMIT) as (url, _, log):
        size_before = log.stat().st_size
        host, port = url.removeprefix("http://").split(":")
        flood = []
        try:
            for _ in range(FLOOD):
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex((host, int(port)))
                flood.append(s)
            time.sleep(2.0)  # let the server take them all in
            times = []
            for _ in range(5):
                status, body, seconds = _get(url + "/healthz")
                assert status == 200, body
                times.append(seconds)
                status, body, seconds = _get(url + "/readyz")
                assert status == 200, body
                times.append(seconds)
            time.sleep(3.0)  # the flood held a while longer
            status, _, seconds = _get(url + "/healthz")
            assert status == 200
            times.append(seconds)
        finally:
            for s in flood:
                s.close()
        grown = log.stat().st_size - size_before
        print(f"\nhealth answers under the flood: max {max(times):.3f} s; log grew {grown} B")
        assert grown < 1_000_000, log.read_text()[-4000:]
        status, metrics, _ = 200, "", 0.0
        with urllib.request.urlopen(url + "/metrics", timeout=HANG_S) as resp:
            metrics = resp.read().decode()
        evicted = [ln for ln in metrics.splitlines() if 'reason="evicted"' in ln]
        assert evicted and float(evicted[0].split()[-1]) > 0


def _upload(url: str, rows: int, seed: int) -> tuple[int, Any, dict[str, str]]:
    """Import ``rows`` new keys (10**7 + ...) of table one.r (dim 4) as an upload."""
    rng = np.random.default_rng(seed)
    keys = np.arange(rows, dtype=np.int64) + 10**7 + seed * 1000
    vectors = rng.normal(size=(rows, 4)).astype(np.float32)
    folder = Path(f"/tmp/hps-abuse-{uuid.uuid4().hex}")
    write_sparse_model(folder, keys, vectors)
    boundary = uuid.uuid4().hex
    head = f"--{boundary}\r\nContent-Disposition: form-data; "
    parts = [f'{head}name="format"\r\n\r\nsparse\r\n'.encode()]
    for field, name in (("keys", "key"), ("vectors", "emb_vector")):
        disposition = f'{head}name="{field}"; filename="{name}"\r\n'
        content = "Content-Type: application/octet-stream\r\n\r\n"
        parts.append((disposition + content).encode() + (folder / name).read_bytes() + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()
    req = urllib.request.Request(
        url + "/v1/models/one/tables/r/import", data=b"".join(parts), method="POST"
    )
    req.add_header("Content-Type", f"multipart/form-data; boundary={boundary}")
    req.add_header("Authorization", f"Bearer {TOKEN}")
    try:
        with urllib.request.urlopen(req, timeout=HANG_S) as resp:
            return (
                resp.status,
                json.loads(resp.read()),
                {k.lower(): v for k, v in resp.headers.items()},
            )
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), {k.lower(): v for k, v in exc.headers.items()}


def _wait_for(path: Path, text: str) -> None:
    deadline = time.monotonic() + HANG_S
    while text not in path.read_text():
        assert time.monotonic() < deadline, path.read_text()[-3000:]
        time.sleep(0.05)


def test_jobs_are_bounded_recorded_and_resumed(stack: Stack, tmp_path: Path) -> None:
    state = tmp_path / "state"
    uploads = state / "uploads"
    lock_dir = topology(stack.config).state_dir
    assert lock_dir is not None
    opts = ("--state-dir", str(state), "--max-jobs", "3")
    held = ExitStack()
    held.enter_context(import_lock(lock_dir))  # `hps serve` importing: the first job waits
    try:
        with admin(stack, tmp_path, *opts) as (url, proc, log):
            answers = [_upload(url, 50, seed) for seed in range(1, 6)]
            assert [a[0] for a in answers] == [202, 202, 202, 429, 429], answers
            assert int(answers[3][2]["retry-after"]) >= 1
            assert answers[3][1]["error"] == "QueueFullError"
            ids = [a[1]["job"] for a in answers[:3]]
            assert _get(f"{url}/v1/jobs/{ids[0]}")[1]["state"] == "running"
            assert _get(f"{url}/v1/jobs/{ids[1]}")[1]["state"] == "queued"
            assert len(list(uploads.iterdir())) == 3  # refused uploads were never staged
            proc.send_signal(signal.SIGTERM)
            _wait_for(log, "2 queued job(s) kept for the next start, 1 running asked to stop")
            held.close()  # the running job gets the lock, writes its first chunk, stops there
            proc.wait(HANG_S)
    finally:
        held.close()
    records = {p.stem: json.loads(p.read_text()) for p in (state / "jobs").glob("*.json")}
    assert [records[i]["state"] for i in ids] == ["interrupted", "queued", "queued"]
    assert "rows written" in records[ids[0]]["error"]
    assert len(list(uploads.iterdir())) == 2  # the queued jobs' uploads, kept for the restart
    (uploads / "stale-from-a-crash").mkdir()

    with admin(stack, tmp_path, *opts, log_name="admin2") as (url, _, _log):
        deadline = time.monotonic() + HANG_S
        views = [_get(f"{url}/v1/jobs/{i}")[1] for i in ids]
        while any(v["state"] in ("queued", "running") for v in views):
            assert time.monotonic() < deadline, views
            time.sleep(0.1)
            views = [_get(f"{url}/v1/jobs/{i}")[1] for i in ids]
        assert [v["state"] for v in views] == ["interrupted", "done", "done"], views
        assert [v["rows_done"] for v in views[1:]] == [50, 50]
        assert list(uploads.iterdir()) == []  # ended and stale uploads removed
        key = 10**7 + 2 * 1000  # the first key of the second upload, resumed
        req = urllib.request.Request(
            url + "/v1/models/one/tables/r/lookup",
            data=json.dumps({"keys": [key]}).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=HANG_S) as resp:
            assert json.loads(resp.read())["results"][0]["found_in"] != "default"


def _post(url: str, body: Any = None) -> tuple[int, Any]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body or {}).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _loads(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=HANG_S) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("hps_admin_model_loads "):
                return float(line.split()[1])
    raise AssertionError("no hps_admin_model_loads")


def test_concurrent_reloads_coalesce_and_warmups_wait(stack: Stack, tmp_path: Path) -> None:
    """40 concurrent reloads of one model are a few loads, not 40 in a row; 40
    warm-ups sent while reloads run all succeed."""
    with admin(stack, tmp_path) as (url, _, _log):
        before = _loads(url)
        with ThreadPoolExecutor(40) as pool:
            answers = list(pool.map(lambda _: _post(url + "/v1/models/one/reload"), range(40)))
        assert all(status == 200 for status, _ in answers), answers
        loads = _loads(url) - before
        print(f"\n40 concurrent reloads: {loads:.0f} load(s) of the model")
        # Usually two (the first, then one for all that came during it); a request that a
        # slow machine lets in only after the second load started makes a third
        assert loads <= 4
        keys = stack.data["one.r"][0][:5].tolist()
        with ThreadPoolExecutor(41) as pool:
            reload = pool.submit(_post, url + "/v1/models/one/reload")
            warm = list(
                pool.map(lambda _: _post(url + "/v1/models/one/warmup", {"keys": keys}), range(40))
            )
            assert reload.result()[0] == 200
        assert all(status == 200 for status, _ in warm), [w for w in warm if w[0] != 200][:3]
