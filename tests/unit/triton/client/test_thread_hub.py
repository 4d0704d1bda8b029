"""HTTP clients used from short-lived threads leave no descriptors behind (``_hub``).

A stdlib HTTP server stands in for Triton: every request gets a 404, which is all the
client needs to have made its connection and its thread's event loop.
"""

from __future__ import annotations

import http.server
import os
import threading
from collections.abc import Iterator

import pytest

from hps.triton.client import Client
from tests.helpers import loopback_http


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def url() -> Iterator[str]:
    with loopback_http(_Quiet) as port:
        yield f"127.0.0.1:{port}"


def _ask(client: Client) -> None:
    assert client.model_ready("absent") is False  # the 404 came back over the connection


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_thread_per_request_leaks_no_descriptors(url: str) -> None:
    def one_request() -> None:
        with Client(url) as client:
            _ask(client)

    for _ in range(3):  # whatever the first threads open once (imports, the server's own)
        t = threading.Thread(target=one_request)
        t.start()
        t.join()
    before = _descriptors()
    for _ in range(40):
        t = threading.Thread(target=one_request)
        t.start()
        t.join()
    assert _descriptors() <= before + 2  # two per thread, 80, before


def test_a_thread_keeps_its_loop_while_one_of_its_clients_is_open(url: str) -> None:
    failures: list[BaseException] = []

    def two_clients() -> None:
        try:
            first, second = Client(url), Client(url)
            _ask(first)
            _ask(second)
            first.close()
            _ask(second)  # still served by the thread's loop
            second.close()
        except BaseException as exc:
            failures.append(exc)

    t = threading.Thread(target=two_clients)
    t.start()
    t.join()
    assert not failures
