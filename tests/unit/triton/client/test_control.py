"""Triton's model-control client translates every way an answer can go wrong into HPS's
errors (BackendUnavailable), so that no caller (the watchdog's thread) dies of a raw one."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from hps.errors import BackendUnavailable, RequestError
from hps.triton.client import ModelControl

ANSWERS = {
    "/v2/repository/models/cut/unload": (b"5 of 100 bytes", 100),  # cut short
    "/v2/repository/index": (b"<html>not JSON</html>", None),
}


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body, length = ANSWERS[self.path]
        self.send_response(200)
        self.send_header("Content-Length", str(length or len(body)))
        self.end_headers()
        self.wfile.write(body[:5] if length else body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_an_answer_cut_short_or_not_json_is_backend_unavailable(server: str) -> None:
    control = ModelControl(server, key=None, timeout=10)
    with pytest.raises(BackendUnavailable, match="IncompleteRead"):
        control.unload("cut")
    with pytest.raises(BackendUnavailable, match="no JSON: '<html>not JSON</html>'"):
        control.states()


FAILED = b'{"error":"load failed for model \'emb\': version 1 is at UNAVAILABLE state"}'


class _FailedLoad(http.server.BaseHTTPRequestHandler):
    """Triton answering a load whose new instances failed in initialize."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._answer(200, b'{"name": "emb", "parameters": {}}')

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(400, FAILED)

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_failed_load_warns_of_what_the_next_shutdown_costs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Triton 2.51 counts a model whose load failed as live until it exits (docs/security.md)."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FailedLoad)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        control = ModelControl(f"127.0.0.1:{httpd.server_address[1]}", key=None, timeout=10)
        # reload: hps reload and the control plane; load: the watchdog
        for call in (control.reload, control.load):
            caplog.clear()
            with caplog.at_level("WARNING"), pytest.raises(RequestError, match="load failed"):
                call("emb")
            warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
            assert len(warnings) == 1
            assert "the next shutdown of this tritonserver waits out its exit" in warnings[0]
    finally:
        httpd.shutdown()
        httpd.server_close()
