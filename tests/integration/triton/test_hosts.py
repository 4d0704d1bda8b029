"""An IPv6 ``--host``: tritonserver behind the request-size gate serves HTTP, gRPC and
metrics at ``[::1]``, becomes ready there (its URLs bracketed), and stops cleanly.

Triton with no model loaded: what is tested is where it listens, not what it serves.
(A host name reaching Triton as a numeric address: tests/unit/triton/supervisor.)
"""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
import tritonclient.grpc

from hps.triton.supervisor.gate import BodyLimit
from hps.triton.supervisor.server import TritonServer

pytestmark = pytest.mark.integration


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_an_ipv6_host_is_served_and_reached_at_its_address(tmp_path: Path) -> None:
    (tmp_path / "repository").mkdir()
    server = TritonServer(
        tmp_path / "repository",
        host="::1",
        explicit=True,
        body_limit=BodyLimit.of(1 << 20),
        log_file=tmp_path / "triton.log",
    )
    try:
        server.start(timeout=60)  # hang guard: unbracketed, it was never ready
        assert server.http_url == f"[::1]:{server.http_port}"
        with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=10) as r:
            assert r.status == 200  # through the gate's [::1] listener
        with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
            assert r.status == 200 and b"nv_" in r.read()  # Triton's own, on ::1
        grpc = tritonclient.grpc.InferenceServerClient(server.grpc_url)
        try:
            assert grpc.is_server_ready()
        finally:
            grpc.close()
        assert server.control.states() == {}  # the admin API, at the bracketed URL
    finally:
        problems = server.stop()
    assert problems == [], f"see {tmp_path / 'triton.log'}"
