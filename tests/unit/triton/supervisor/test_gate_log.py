"""The request-size gate's error log as ``hps serve`` shows it without --verbose: counts per
kind of entry, at most once per interval, nothing a client sent."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from hps.triton.supervisor import gate_log
from hps.triton.supervisor.gate_log import GateLog, kind

TOO_LARGE = (
    "2026/11/28 13:41:40 [error] 9010#9010: *{n} client intended to send too large body: "
    '{n}001 bytes, client: 10.0.0.{n}, server: , request: "POST /v2/evil{n} HTTP/1.1", '
    'host: "attacker{n}.example"'
)
UPSTREAM = (
    "2026/11/28 13:41:41 [error] 9011#9011: *9 connect() failed (111: Connection refused) "
    'while connecting to upstream, client: 127.0.0.1, server: , request: "GET / HTTP/1.1"'
)


def test_a_kind_is_nginx_s_words_without_what_the_client_sent() -> None:
    assert kind(TOO_LARGE.format(n=3)) == "client intended to send too large body: N bytes"
    assert kind(UPSTREAM) == (
        "connect() failed (N: Connection refused) while connecting to upstream"
    )
    assert kind("2026/11/28 13:41:40 [warn] 9010#9010: conflicting server name") == (
        "conflicting server name"
    )
    assert kind("not an nginx entry") is None
    long = f"2026/11/28 13:41:40 [error] 1#1: {'x' * 500}"
    assert len(kind(long) or "") == gate_log.MAX_KIND_CHARS


def test_counts_are_reported_once_per_kind_and_then_start_again(tmp_path: Path) -> None:
    path, out = tmp_path / "error.log", io.StringIO()
    log = GateLog(path, out, interval=60)
    log.report()  # no file yet: nothing to say
    with open(path, "a") as f:
        f.write("\n".join([TOO_LARGE.format(n=1), TOO_LARGE.format(n=2), UPSTREAM]) + "\n")
        f.write(TOO_LARGE.format(n=4)[:30])  # a line nginx is still writing
    log.report()
    line = out.getvalue()
    assert line.count("\n") == 1
    assert "2 x client intended to send too large body: N bytes; 1 x connect() failed" in line
    for sent in ("evil", "attacker", "10.0.0.", "POST"):
        assert sent not in line
    log.report()
    assert out.getvalue() == line  # nothing new, no line
    with open(path, "a") as f:
        f.write(TOO_LARGE.format(n=4)[30:] + "\n")
    log.report()
    second = out.getvalue().splitlines()[1]
    assert second.startswith("request-size gate (nginx), last 60s: 1 x client intended to")


def test_a_large_log_is_emptied_once_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gate_log, "MAX_LOG_BYTES", 1000)
    path, out = tmp_path / "error.log", io.StringIO()
    path.write_text((UPSTREAM + "\n") * 10)
    log = GateLog(path, out)
    log.report()
    assert "10 x connect() failed" in out.getvalue() and path.stat().st_size == 0
    with open(path, "a") as f:  # nginx appends from the start again
        f.write(UPSTREAM + "\n")
    log.report()
    assert "1 x connect() failed" in out.getvalue().splitlines()[1]


def test_the_thread_reports_every_interval_and_at_stop(tmp_path: Path) -> None:
    path, out = tmp_path / "error.log", io.StringIO()
    log = GateLog(path, out, interval=0.05)
    log.start()
    path.write_text(UPSTREAM + "\n")
    for _ in range(100):
        if out.getvalue():
            break
        time.sleep(0.05)
    with open(path, "a") as f:
        f.write(UPSTREAM + "\n")
    log.stop()
    assert [line.split(": ", 1)[1][:4] for line in out.getvalue().splitlines()] == ["1 x ", "1 x "]
