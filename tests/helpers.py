"""Small builders shared by the tests."""

from __future__ import annotations

import contextlib
import http.server
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hps.config import PSConfig, parse_config
from hps.lookup import LookupSession
from hps.net import free_port


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """A request handler for :func:`loopback_http` that logs nothing and answers with
    :meth:`reply`."""

    def reply(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def loopback_http(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[int]:
    """A threaded stdlib HTTP server on a free loopback port (yielded), stopped on exit."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def unique_name(prefix: str = "m") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def make_config(
    tmp_path: Any, *, models: list[dict[str, Any]] | None = None, **top: Any
) -> PSConfig:
    """A ps.json with one two-table model (dims 4 and 8) on hash_map + rocks_db by default."""
    doc: dict[str, Any] = {
        "supportlonglong": True,
        "models": models
        or [
            {
                "model": "demo",
                "embedding_table_names": ["t0", "t1"],
                "embedding_vecsize_per_table": [4, 8],
                "maxnum_catfeature_query_per_table_per_sample": [2, 3],
                "default_value_for_each_table": [0.5, -1.0],
                "max_batch_size": 16,
                "gpucache": False,
            }
        ],
        "volatile_db": {"type": "hash_map"},
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rocksdb")},
    }
    doc.update(top)
    return parse_config(doc, "test-ps.json")


def rows(keys: np.ndarray, dim: int, seed: int = 0) -> np.ndarray:
    """Deterministic vectors for keys: row i of key k is a function of k."""
    k = np.asarray(keys, dtype=np.int64)
    base = (k % 1000).astype(np.float32)[:, None]
    return (base + np.arange(dim, dtype=np.float32)[None, :] * 0.25 + seed).astype(np.float32)


def wait_for_banner(proc: subprocess.Popen[str], timeout: float = 90.0) -> list[str]:
    """Lines `hps serve` printed up to its banner's last `hps query` line (the CTR model's)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"hps serve exited early ({proc.poll()}):\n" + "".join(lines))
        lines.append(line)
        if "query --url" in line and "--samples" in line:
            return lines
    pytest.fail("no banner from hps serve:\n" + "".join(lines))


def cached_after_lookup(session: LookupSession, table: str, keys: np.ndarray) -> bool:
    """Look ``keys`` up, then whether L1 holds them all (background inserts done).

    A lookup that overlapped an update's L1 refresh leaves its keys out of L1 (its rows were
    read before the refresh, so they may be older); the next lookup takes them in: wait on
    this rather than asserting L1 after one lookup."""
    session.lookup(table, keys)
    session.pipeline.drain()
    return bool(session.caches[table].resident(keys).all())


def launch_admin(
    args: list[str],
    log: Path,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
    start_s: float = 60.0,
) -> tuple[subprocess.Popen[bytes], str]:
    """``hps admin ARGS`` on a free loopback port, its output in ``log``; returns the process
    and its URL once ``/healthz`` answers (killed, and the log shown, if it never does)."""
    port = free_port()
    cmd = [sys.executable, "-m", "hps.cli", "admin", *args, "--port", str(port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=preexec_fn
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + start_s
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1):
                return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise AssertionError(f"hps admin did not start: {log.read_text()}") from None
            time.sleep(0.2)


def stop_by_pid(proc: subprocess.Popen[bytes], wait_s: float = 20.0) -> None:
    """SIGTERM, then SIGKILL if it has not ended within ``wait_s``; nothing if it has ended."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def running_admin(
    args: list[str],
    log: Path,
    *,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
    start_s: float = 60.0,
    stop_s: float = 20.0,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """:func:`launch_admin`, its URL and process, then :func:`stop_by_pid`."""
    proc, url = launch_admin(args, log, env=env, preexec_fn=preexec_fn, start_s=start_s)
    try:
        yield url, proc
    finally:
        stop_by_pid(proc, stop_s)
