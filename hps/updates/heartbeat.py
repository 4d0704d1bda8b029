"""The consumer loop's pulse: liveness that stops when the loop stalls.

:class:`UpdateConsumer <hps.updates.consumer.UpdateConsumer>` calls :meth:`Heartbeat.beat`
on every pass of its loop: before each poll and before each retry of a batch a tier refused
(a Redis outage is waited out, not a stall). What reads the pulse:

- ``/healthz`` on ``hps consume``'s metrics port (:func:`serve_metrics`): 200 while the last
  pass is at most ``max_age_s`` old, 503 before the first pass and once the loop stalls.
  The port itself keeps answering; the answer comes from the loop. Kubernetes probes use it.
- a heartbeat file (``hps consume --heartbeat-file``), touched at most once a second and
  removed on a clean exit; ``hps consume-check`` (:func:`check_file`) fails once it is older
  than ``max_age_s``. For health checks that run a command (Compose).

Watches (:meth:`Heartbeat.watch`, e.g. :class:`hps.tiers.shared_l2.SharedL2Watch`) ride on the
pulse: each beat runs their ``check()`` in the loop's own thread, between batches (a watch
decides itself how often to act), and ``/healthz`` answers 503 with a watch's ``problem()``
while it has one (a replaced shared-memory L2 being refilled).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

FILE_INTERVAL_S = 1.0
"""The heartbeat file is touched at most this often (the in-memory pulse on every pass)."""


class Watch(Protocol):
    """Something a beat runs and ``/healthz`` asks (:class:`hps.tiers.shared_l2.SharedL2Watch`)."""

    def check(self, *, force: bool = False) -> bool: ...
    def problem(self) -> str | None: ...


class Heartbeat:
    """When the consumer loop last went round; optionally mirrored into a file's mtime."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        file_interval_s: float = FILE_INTERVAL_S,
    ) -> None:
        self.path = Path(path) if path else None
        self._clock = clock
        self._file_interval_s = file_interval_s
        self._last: float | None = None
        self._last_file: float | None = None
        self._watches: list[Watch] = []

    def watch(self, watch: Watch) -> None:
        """Run ``watch.check()`` on every beat; its ``problem()`` fails :meth:`check`."""
        self._watches.append(watch)

    def beat(self) -> None:
        """One pass of the loop (cheap: a clock read; a file touch at most once a second;
        the watches' checks, which act at most every few seconds)."""
        for watch in self._watches:
            try:
                watch.check()
            except Exception:  # a failing watch reports through problem(), not by a crash
                log.exception("heartbeat watch %r", watch)
        now = self._clock()
        self._last = now
        if self.path is not None and (
            self._last_file is None or now - self._last_file >= self._file_interval_s
        ):
            self._last_file = now
            self.path.touch()  # creates it, or sets its mtime to now

    def age_s(self) -> float:
        """Seconds since the last pass; infinity before the first."""
        return float("inf") if self._last is None else self._clock() - self._last

    def check(self, max_age_s: float) -> str | None:
        """None while alive and no watch has a problem, else why not (the text a failing
        probe shows)."""
        verdict = _verdict(self.age_s(), max_age_s, "the consumer loop")
        if verdict is None:
            verdict = next((p for w in self._watches if (p := w.problem())), None)
        return verdict

    def close(self) -> None:
        """A clean stop: the file goes, so a check fails at once rather than after max age."""
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


def _verdict(age_s: float, max_age_s: float, what: str) -> str | None:
    if age_s == float("inf"):
        return f"{what} has not started a pass yet"
    if age_s > max_age_s:
        return f"{what} last went round {age_s:.1f} s ago (limit {max_age_s:g} s): stalled"
    return None


def check_file(path: str | Path, max_age_s: float, *, now: float | None = None) -> str | None:
    """None when the heartbeat file at ``path`` is at most ``max_age_s`` old, else why not."""
    try:
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return f"no heartbeat file {path}: the consumer loop has not started or has stopped"
    age = (time.time() if now is None else now) - mtime
    return _verdict(max(age, 0.0), max_age_s, f"the consumer loop ({path})")


def serve_metrics(
    port: int, address: str, heartbeat: Heartbeat, max_age_s: float
) -> ThreadingHTTPServer:
    """Prometheus metrics on ``/metrics`` (and ``/``), the loop's liveness on ``/healthz``.

    Served from a daemon thread; ``shutdown()`` and ``server_close()`` stop it.
    """
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            route = self.path.split("?", 1)[0]
            if route == "/healthz":
                problem = heartbeat.check(max_age_s)
                status = 503 if problem else 200
                body = (problem or f"ok: last pass {heartbeat.age_s():.1f} s ago") + "\n"
                self._send(status, "text/plain; charset=utf-8", body.encode())
            elif route in ("/", "/metrics"):
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(REGISTRY))
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found\n")

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the prober gave up (its timeout) before the answer: nothing to report

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # a probe every few seconds is not worth a log line

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="hps-consume-metrics", daemon=True).start()
    return server
