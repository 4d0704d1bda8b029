"""The Triton address every client takes: ``host:port``, with or without its protocol's
scheme; anything else a one-line RequestError, never a client library's traceback (nor
the ``Exception ignored in __del__`` of its half-made client at exit)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hps.errors import RequestError
from hps.net import free_port
from hps.triton.client import Client, ModelControl
from hps.triton.client.address import triton_address


@pytest.mark.parametrize(
    ("url", "grpc", "address"),
    [
        ("127.0.0.1:8000", False, "127.0.0.1:8000"),
        ("http://127.0.0.1:8000", False, "127.0.0.1:8000"),
        ("HTTP://triton.svc:8000/", False, "triton.svc:8000"),
        ("[::1]:8000", False, "[::1]:8000"),
        ("localhost", False, "localhost"),
        ("grpc://127.0.0.1:8001", True, "127.0.0.1:8001"),
        ("127.0.0.1:8001", True, "127.0.0.1:8001"),
    ],
)
def test_an_address_with_or_without_its_scheme(url: str, grpc: bool, address: str) -> None:
    assert triton_address(url, grpc=grpc) == address


@pytest.mark.parametrize(
    ("url", "grpc", "message"),
    [
        ("https://127.0.0.1:8000", False, "an HTTP client takes host:port or http://host:port"),
        ("grpc://127.0.0.1:8001", False, "not grpc://"),
        ("http://127.0.0.1:8001", True, "a gRPC client takes host:port or grpc://host:port"),
        ("127.0.0.1:abc", False, "expected host:port or http://host:port"),
        ("127.0.0.1:99999", False, "expected host:port"),
        ("127.0.0.1:8000/v2", False, "expected host:port"),
        ("http://", False, "expected host:port"),
        ("", True, "expected host:port or grpc://host:port"),
    ],
)
def test_anything_else_is_a_request_error_naming_it(url: str, grpc: bool, message: str) -> None:
    with pytest.raises(RequestError, match=f"^Triton address {url!r}: .*{message}"):
        triton_address(url, grpc=grpc)


def test_the_clients_take_the_address_with_its_scheme() -> None:
    with Client("http://127.0.0.1:1") as http, Client("grpc://127.0.0.1:1", grpc=True) as grpc:
        assert http.url == grpc.url == "127.0.0.1:1"
    assert ModelControl("http://127.0.0.1:1/", None).base == "http://127.0.0.1:1"
    with pytest.raises(RequestError, match="an HTTP client takes"):
        ModelControl("https://127.0.0.1:1", None)


def hps(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hps.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "HPS_ADMIN_KEY": "k" * 32},
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["query", "--url", "http://127.0.0.1:{port}", "--keys", "1"],
         "hps query: error: cannot reach Triton at 127.0.0.1:{port}: "),
        (["query", "--url", "127.0.0.1:abc", "--keys", "1"],
         "hps query: error: Triton address '127.0.0.1:abc': expected host:port"),
        (["query", "--grpc", "--url", "http://127.0.0.1:{port}", "--keys", "1"],
         "hps query: error: Triton address 'http://127.0.0.1:{port}': a gRPC client takes"),
        (["reload", "--url", "http://127.0.0.1:{port}"],
         "hps reload: error: cannot reach Triton at http://127.0.0.1:{port}: "
         "[Errno 111] Connection refused\n"),
    ],
)  # fmt: skip
def test_a_url_with_a_scheme_is_one_error_line_at_most(args: list[str], message: str) -> None:
    """``http://`` is stripped, so the error is the server's absence; no traceback, no
    ``Exception ignored`` from tritonclient's ``__del__``, no ``http://http://``."""
    port = free_port()
    done = hps(*(a.format(port=port) for a in args))
    assert done.returncode == 2
    assert done.stderr.startswith(message.format(port=port)), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
