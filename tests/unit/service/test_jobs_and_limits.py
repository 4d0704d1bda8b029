"""The control plane's job queue (bounds, records, resume), coalesced reloads, the
connection guard under real uvicorn, and the rate-limited log filter."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from hps.errors import QueueFullError
from hps.service.connections import ConnectionGuard, RateLimitFilter
from hps.service.job_records import Job
from hps.service.jobs import JobRegistry
from hps.service.limits import BodyTimeout, TokenAndBodyLimits
from hps.service.triton_admin import ReloadQueue
from hps.types import JSON

HANG_S = 30.0  # hang guards only


def _blocking(gate: threading.Event, started: threading.Event | None = None):  # type: ignore[no-untyped-def]
    def work(job: Job) -> JSON:
        if started is not None:
            started.set()
        while not gate.wait(0.01):
            job.advance(0)  # a chunk boundary: raises once the registry closes
        return {"ok": True}

    return work


def test_queue_is_bounded_by_count_and_staged_bytes(tmp_path: Path) -> None:
    jobs = JobRegistry(max_jobs=3, max_staged_bytes=1000)
    jobs.attach(tmp_path / "jobs", tmp_path / "uploads")
    gate = threading.Event()
    try:
        jobs.submit(Job("import", "m.t", 1, staged_bytes=600), _blocking(gate))
        with pytest.raises(QueueFullError, match="pass the limit") as exc:
            jobs.submit(Job("import", "m.t", 1, staged_bytes=500), _blocking(gate))
        assert exc.value.status == 429 and exc.value.retry_after_s >= 1
        jobs.submit(Job("import", "m.t", 1, staged_bytes=300), _blocking(gate))
        jobs.submit(Job("import", "m.t", 1), _blocking(gate))
        staged = tmp_path / "uploads" / "x"
        staged.mkdir()
        with pytest.raises(QueueFullError, match="3 jobs are pending"):
            jobs.submit(Job("import", "m.t", 1, staged=str(staged)), _blocking(gate))
        assert not staged.exists()  # a refused job's upload is not left behind
        with pytest.raises(QueueFullError, match="exceed the limit"):
            jobs.reserve(1001)
    finally:
        gate.set()
        jobs.close()


def test_an_upload_that_reserved_less_than_it_staged_is_held_to_the_budget(
    tmp_path: Path,
) -> None:
    """A chunked upload (no Content-Length) reserves 0 bytes: what it staged is counted
    when its job is submitted, and refused past the budget (its upload removed)."""
    jobs = JobRegistry(max_jobs=8, max_staged_bytes=1000)
    jobs.attach(tmp_path / "jobs", tmp_path / "uploads")
    gate = threading.Event()

    def staged(name: str, n: int) -> str:
        folder = tmp_path / "uploads" / name
        folder.mkdir(parents=True)
        (folder / "keys").write_bytes(b"x" * n)
        return str(folder)

    try:
        with jobs.reserved(0):
            jobs.submit(Job("import", "m.t", 1, staged=staged("a", 600)), _blocking(gate))
        second = staged("b", 600)
        with (
            pytest.raises(QueueFullError, match="600 more would pass the limit of 1000"),
            jobs.reserved(0),
        ):
            jobs.submit(Job("import", "m.t", 1, staged=second), _blocking(gate))
        assert not Path(second).exists()
        with jobs.reserved(0):  # what fits is admitted
            jobs.submit(Job("import", "m.t", 1, staged=staged("c", 300)), _blocking(gate))
    finally:
        gate.set()
        jobs.close()


def test_a_reservation_is_taken_over_by_the_job_it_admits(tmp_path: Path) -> None:
    jobs = JobRegistry(max_jobs=1)
    gate = threading.Event()
    try:
        with jobs.reserved(10):
            with pytest.raises(QueueFullError):
                jobs.reserve(0)  # the request's place counts before its job exists
            job = jobs.submit(Job("import", "m.t", 1), _blocking(gate))
        assert job.staged_bytes == 10 and jobs.load() == (1, 10)
        with jobs.reserved(0) as res:
            pass
        raise AssertionError(f"admitted past the limit: {res}")
    except QueueFullError:
        pass
    finally:
        gate.set()
        jobs.close()
    assert jobs.get(job.id).state == "done"


def test_records_survive_a_restart(tmp_path: Path) -> None:
    """Queued jobs resume, the running one is interrupted with its reason, staged folders
    of ended jobs and stale ones are removed."""
    uploads = tmp_path / "uploads"
    jobs = JobRegistry()
    jobs.attach(tmp_path / "jobs", uploads)
    gate, started = threading.Event(), threading.Event()
    folders = [uploads / f"u{i}" for i in range(3)]
    for f in folders:
        f.mkdir(parents=True)
        (f / "keys").write_bytes(b"x" * 10)
    running = jobs.submit(Job("import", "m.t", 5, staged=str(folders[0])), _blocking(gate, started))
    queued = [
        jobs.submit(Job("import", "m.t", 5, staged=str(f), params={"n": str(i)}), _blocking(gate))
        for i, f in enumerate(folders[1:], 1)
    ]
    unknown = jobs.submit(Job("mystery", "m.t", 1), _blocking(gate))
    assert started.wait(HANG_S)
    (uploads / "stale").mkdir()
    jobs.close(wait_s=HANG_S)  # SIGTERM: the running job stops at its next chunk
    assert running.state == "interrupted" and "rows written" in str(running.error)
    assert not folders[0].exists()
    assert all(f.exists() for f in folders[1:])  # queued: kept for the next start

    ran: list[str] = []

    def resume(job: Job) -> object:
        def work(j: Job) -> JSON:
            ran.append(j.params["n"])
            return {"resumed": True}

        return work

    again = JobRegistry()
    again.attach(tmp_path / "jobs", uploads)
    again.resumable("import", resume)  # type: ignore[arg-type]
    counts = again.recover()
    assert counts == {"resumed": 2, "interrupted": 1, "kept": 1}
    deadline = time.monotonic() + HANG_S
    while any(again.get(q.id).state != "done" for q in queued) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran == ["1", "2"]
    assert [again.get(q.id).view()["result"] for q in queued] == [{"resumed": True}] * 2
    assert again.get(running.id).state == "interrupted"
    assert again.get(unknown.id).state == "interrupted"
    assert "restarted" in str(again.get(unknown.id).error)
    assert list(uploads.iterdir()) == []  # ended jobs' and stale uploads removed
    again.close()


def test_a_failed_job_s_error_is_scrubbed_and_an_unrecordable_result_still_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hps import redact

    monkeypatch.setattr(redact, "_values", {"redis-pass-0123"})
    jobs = JobRegistry()
    jobs.attach(tmp_path / "jobs", tmp_path / "uploads")

    def leaks(job: Job) -> JSON:
        raise RuntimeError("cannot reach redis://:redis-pass-0123@10.0.0.1")

    def unrecordable(job: Job) -> JSON:
        return {"rows": object()}  # type: ignore[dict-item]

    failed = jobs.submit(Job("import", "m.t", 1), leaks)
    odd = jobs.submit(Job("import", "m.t", 1), unrecordable)
    deadline = time.monotonic() + HANG_S
    while {failed.state, odd.state} & {"queued", "running"} and time.monotonic() < deadline:
        time.sleep(0.01)
    assert failed.state == "failed" and "redis-pass" not in str(failed.view())
    assert "<redacted>" in str(failed.error)
    assert "redis-pass" not in (tmp_path / "jobs" / f"{failed.id}.json").read_text()
    assert odd.state == "done"  # ended, though its record could not be written
    jobs.submit(Job("import", "m.t", 1), lambda job: {"ok": True})  # the queue goes on
    jobs.close(wait_s=HANG_S)


def test_a_job_found_running_is_marked_interrupted(tmp_path: Path) -> None:
    folder = tmp_path / "jobs"
    folder.mkdir()
    job = Job("import", "m.t", 10, state="running", rows_done=4, staged=str(tmp_path / "up"))
    (tmp_path / "up").mkdir()
    (folder / f"{job.id}.json").write_text(json.dumps(job.record()))
    (folder / "garbage.json").write_text("{")
    jobs = JobRegistry()
    jobs.attach(folder, tmp_path / "uploads")
    jobs.recover()
    view = jobs.get(job.id).view()
    assert view["state"] == "interrupted" and "4 of 10 rows" in str(view["error"])
    assert not (tmp_path / "up").exists() and not (folder / "garbage.json").exists()
    on_disk = json.loads((folder / f"{job.id}.json").read_text())
    assert on_disk["state"] == "interrupted"
    jobs.close()


def test_import_past_the_queue_gets_429_before_its_body_is_read() -> None:
    jobs = JobRegistry(max_jobs=1)
    read: list[int] = []
    app = FastAPI()

    @app.post("/v1/models/m/tables/t/import")
    async def imp(request: object) -> JSON:
        return {}

    async def inner(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "http":
            read.append(1)
        await app(scope, receive, send)

    guarded = TokenAndBodyLimits(inner, "tok", jobs=jobs)
    with jobs.reserved(0), TestClient(guarded) as client:  # type: ignore[arg-type]
        r = client.post(
            "/v1/models/m/tables/t/import",
            content=b"x" * 100,
            headers={"authorization": "Bearer tok"},
        )
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"] == "QueueFullError" and read == []
    assert jobs.load() == (0, 0)
    jobs.close()


def test_concurrent_reloads_coalesce() -> None:
    loads: list[tuple[str, object]] = []
    gate = threading.Event()

    def load(model: str, parameters: dict[str, str] | None) -> None:
        loads.append((model, parameters))
        gate.wait(HANG_S)

    queue = ReloadQueue(load)
    first = threading.Thread(target=queue.reload, args=("m", None))
    first.start()
    while not loads:
        time.sleep(0.001)
    waiters = [
        threading.Thread(target=queue.reload, args=("m", {"w": "1"} if i == 3 else None))
        for i in range(40)
    ]
    for t in waiters:
        t.start()
    deadline = time.monotonic() + HANG_S
    while sum(r.joined for r in queue._queues["m"][1:]) < 40 and time.monotonic() < deadline:
        time.sleep(0.001)
    gate.set()
    for t in [first, *waiters]:
        t.join(HANG_S)
    # the running one, then one for all 40 that came during it (carrying the parameters)
    assert loads == [("m", None), ("m", {"w": "1"})] and queue.loads == 2
    assert not queue.busy("m") and queue.wait_idle("m", 0)


def test_a_failed_reload_fails_every_request_that_shared_it() -> None:
    gate = threading.Event()

    def load(model: str, parameters: dict[str, str] | None) -> None:
        gate.wait(HANG_S)
        raise RuntimeError("boom")

    queue = ReloadQueue(load)
    errors: list[str] = []

    def call() -> None:
        try:
            queue.reload("m", None)
        except RuntimeError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=call) for _ in range(5)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + HANG_S  # all five in: one load running, one queued
    while sum(r.joined for r in queue._queues.get("m", [])) < 5:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    gate.set()
    for t in threads:
        t.join(HANG_S)
    assert errors == ["boom"] * 5 and queue.loads <= 2


def test_rate_limited_log_filter() -> None:
    flt = RateLimitFilter(interval_s=3600)
    logger = logging.getLogger("test.rate_limited")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger.addHandler(Keep())
    logger.addFilter(flt)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    err = OSError(24, "Too many open files")
    for _ in range(1000):
        logger.error("socket.accept() out of system resource", exc_info=err)
        logger.warning("Invalid HTTP request received.")
    logger.info("an ordinary line")
    assert [r.getMessage() for r in records] == [
        "socket.accept() out of system resource",
        "Invalid HTTP request received.",
        "an ordinary line",
    ]
    flt.interval_s = 0.0
    logger.warning("Invalid HTTP request received.")
    assert (
        records[-1].getMessage() == "Invalid HTTP request received. (999 more like it not logged)"
    )


def test_the_kafka_clients_lines_are_limited_whatever_their_numbers() -> None:
    """A broker down: each lag read's clients log dozens of alike lines, numbers aside."""
    from hps.service.connections import DRIVER_LOGGER, limit_repeated_logs

    logger = logging.getLogger(DRIVER_LOGGER)
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler, before = Keep(), list(logger.filters)
    logger.addHandler(handler)
    try:
        limit_repeated_logs(interval_s=3600)
        for ms in range(60):
            logger.error("FAIL [rdkafka#consumer-%d] 127.0.0.1:1/bootstrap: Connect to ipv4#"
                         "127.0.0.1:1 failed: Connection refused (after %dms)", ms, ms)  # fmt: skip
        assert len(records) == 1
    finally:
        logger.removeHandler(handler)
        logger.filters[:] = before


@contextmanager
def _serving(app: FastAPI, guard: ConnectionGuard) -> Iterator[tuple[str, uvicorn.Server]]:
    """``app`` under real uvicorn on a free port, its connections guarded by ``guard``."""
    import asyncio

    from hps.net import free_port

    port = free_port()
    config = uvicorn.Config(app, port=port, http=guard.protocol(), log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + HANG_S
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield f"127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(HANG_S)


def _health_app() -> FastAPI:
    app = FastAPI()

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


@pytest.fixture
def guarded_server() -> Iterator[tuple[str, ConnectionGuard]]:
    """Real uvicorn on a free port with a connection guard of 50 and a 1 s read timeout."""
    guard = ConnectionGuard(50, read_timeout_s=1.0)
    with _serving(_health_app(), guard) as (address, _):
        yield address, guard


def test_guard_keeps_health_answering_under_idle_connections(
    guarded_server: tuple[str, ConnectionGuard],
) -> None:
    address, guard = guarded_server
    host, port = address.split(":")
    idle = [socket.create_connection((host, int(port))) for _ in range(400)]
    try:
        for _ in range(5):
            with urllib.request.urlopen(f"http://{address}/healthz", timeout=HANG_S) as r:
                assert r.status == 200
        assert guard.open <= 50 and guard.evicted >= 350
        deadline = time.monotonic() + HANG_S
        while guard.open and time.monotonic() < deadline:  # idle past the read timeout
            time.sleep(0.1)
        assert guard.open == 0 and guard.timed_out > 0
    finally:
        for s in idle:
            s.close()


BIG = 256 * 1024  # an answer past the transport's 64 KiB high-water mark


def _unread_pipeline(address: str, requests: int) -> socket.socket:
    """A client that pipelines ``requests`` large answers and reads none of them."""
    host, port = address.split(":")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    s.connect((host, int(port)))
    s.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * requests)
    return s


def _wait(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + HANG_S
    while not cond():
        assert time.monotonic() < deadline, "hang guard"
        time.sleep(0.05)


def test_guard_closes_connections_whose_answers_go_unread() -> None:
    """Clients that pipeline requests and never read the answers keep their connections
    busy (uvicorn waits for the client to read): the guard makes room by closing one when
    every connection is like that, and closes them all after the read timeout, their
    descriptors released (aborted: a close would wait for the unread answers)."""
    app = _health_app()

    @app.get("/big")
    async def big() -> Response:
        return Response(b"x" * BIG, media_type="application/octet-stream")

    guard = ConnectionGuard(8, read_timeout_s=3.0)
    with _serving(app, guard) as (address, server):
        stuck = [_unread_pipeline(address, 20) for _ in range(8)]
        try:
            _wait(lambda: guard.open == 8 and guard.sending == 8)
            # every connection busy: the new one closes the one stalled longest
            with urllib.request.urlopen(f"http://{address}/healthz", timeout=HANG_S) as r:
                assert r.status == 200
            assert (guard.evicted, guard.refused) == (1, 0)
            _wait(lambda: guard.open == 0)  # the other 7: nothing read for 3 s
            assert guard.stalled == 7 and guard.timed_out == 0
            # uvicorn saw each connection lost: their descriptors are closed
            _wait(lambda: not server.server_state.connections)
            with urllib.request.urlopen(f"http://{address}/healthz", timeout=HANG_S) as r:
                assert r.status == 200
        finally:
            for s in stuck:
                s.close()


def test_guard_keeps_a_slow_reader_of_a_large_answer() -> None:
    """Bytes left to send longer than the read timeout, while the client reads some of them
    between two looks, are no stall."""
    app = _health_app()
    size = 16 * 1024**2  # past what the kernel's socket buffers take (4 MiB each here)

    @app.get("/big")
    async def big() -> Response:
        return Response(b"x" * size, media_type="application/octet-stream")

    guard = ConnectionGuard(8, read_timeout_s=1.0)
    with _serving(app, guard) as (address, _):
        host, port = address.split(":")
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
        s.connect((host, int(port)))
        try:
            s.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            _wait(lambda: guard.sending == 1)
            first, last, got = time.monotonic(), 0.0, 0
            while chunk := s.recv(256 * 1024):  # a few MiB/s: seconds to read it all
                got += len(chunk)
                last = time.monotonic() if guard.sending else last
                time.sleep(0.05)
            assert got > size and guard.stalled == 0
            assert last - first > 2.0  # sending past the read timeout, answered in full
        finally:
            s.close()


def test_a_body_that_stops_coming_is_answered_408_and_its_connection_closed() -> None:
    """A client that sends part of a body and then nothing held its connection (and a slot
    of --max-connections) for ever: past the read timeout it gets a 408 and is closed."""
    guard = ConnectionGuard(4, read_timeout_s=0.5)
    limited = TokenAndBodyLimits(_echo_app(), "tok", read_timeout_s=guard.read_timeout_s)
    with _serving(limited, guard) as (address, _):  # type: ignore[arg-type]
        host, port = address.split(":")
        slow = []
        for _ in range(4):
            s = socket.create_connection((host, int(port)), timeout=HANG_S)
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok\r\n"
                      b"Content-Length: 100\r\n\r\n" + b"x" * 10)  # fmt: skip
            slow.append(s)
        try:
            for s in slow:
                answer = b""
                while chunk := s.recv(4096):  # to the end: closed by the server
                    answer += chunk
                assert answer.startswith(b"HTTP/1.1 408") and b'detail":"request body ' in answer
            with urllib.request.urlopen(f"http://{address}/healthz", timeout=HANG_S) as r:
                assert r.status == 200
            # a trickle, a byte every 0.1 s (each within the timeout): past it, far too slow
            t = socket.create_connection((host, int(port)), timeout=0.1)
            slow.append(t)
            t.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok\r\n"
                      b"Content-Length: 100\r\n\r\nx")  # fmt: skip
            answer = b""
            deadline = time.monotonic() + HANG_S
            while time.monotonic() < deadline:
                try:
                    chunk = t.recv(4096)
                except TimeoutError:
                    t.sendall(b"x")
                    continue
                if not chunk:
                    break
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408"), answer
        finally:
            for s in slow:
                s.close()


def _echo_app() -> FastAPI:
    app = _health_app()

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    @app.exception_handler(BodyTimeout)  # as create_app's
    async def timed_out(request: Request, exc: BodyTimeout) -> JSONResponse:
        return JSONResponse({"error": "BodyTimeout", "detail": exc.detail}, status_code=408)

    return app


def test_a_large_body_that_stops_is_answered_408_within_the_timeout_of_its_last_bytes() -> None:
    """1 MiB sent, then nothing: the allowance of 1 s per 64 KiB is for bodies that keep
    coming (a stalled upload held its staged budget, and the shutdown, 16 s more here)."""
    guard = ConnectionGuard(4, read_timeout_s=0.5)
    limited = TokenAndBodyLimits(_echo_app(), "tok", read_timeout_s=guard.read_timeout_s)
    with _serving(limited, guard) as (address, _):  # type: ignore[arg-type]
        host, port = address.split(":")
        with socket.create_connection((host, int(port)), timeout=HANG_S) as s:
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok\r\n"
                      b"Content-Length: 2000000\r\n\r\n" + b"x" * (1 << 20))  # fmt: skip
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"request body stopped: nothing for 0.5 s after 1,048,576 bytes" in answer


def test_a_client_that_leaves_mid_body_costs_no_log_line(caplog: pytest.LogCaptureFixture) -> None:
    guard = ConnectionGuard(4, read_timeout_s=30.0)
    limited = TokenAndBodyLimits(_echo_app(), "tok", read_timeout_s=guard.read_timeout_s)
    caplog.set_level(logging.DEBUG, logger="hps.service.limits")
    with _serving(limited, guard) as (address, _):  # type: ignore[arg-type]
        host, port = address.split(":")
        with socket.create_connection((host, int(port)), timeout=HANG_S) as s:
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok\r\n"
                      b"Content-Length: 100000\r\n\r\n" + b"x" * 1000)  # fmt: skip
            time.sleep(0.2)  # the route is reading the body
        deadline = time.monotonic() + HANG_S
        while "the client left" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.02)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_refused_growth_frees_its_bytes_for_the_upload_beside_it() -> None:
    """Two chunked uploads growing together past the budget: the one refused leaves it at
    once, so the other goes on (both were refused while the first still counted)."""
    jobs = JobRegistry(max_jobs=4, max_staged_bytes=10_000)
    try:
        a, b = jobs.reserve(0), jobs.reserve(0)
        jobs.grow(a, 5_000)
        jobs.grow(b, 5_000)
        with pytest.raises(QueueFullError, match="this upload's 5500 bytes so far"):
            jobs.grow(a, 5_500)
        assert jobs.load() == (1, 5_000)
        jobs.grow(b, 10_000)  # the whole budget is b's now
        b.release()
        a.release()  # as the request's end does: already released, nothing changes
        assert jobs.load() == (0, 0)
    finally:
        jobs.close()
