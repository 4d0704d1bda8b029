"""A tritonserver process: its command line, started and stopped by PID."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hps import net
from hps.errors import BackendUnavailable
from hps.net import free_port
from hps.triton.supervisor.gate import BodyLimit
from hps.triton.supervisor.install import TritonInstall
from hps.triton.supervisor.server import TritonServer


def test_command_line() -> None:
    install = TritonInstall(Path("/x/tritonserver"), Path("/x"), None)
    server = TritonServer(Path("/repo"), explicit=True, load_models=["a", "b"], install=install)
    cmd = server.command(Path("/backends"))
    assert cmd[0] == "/x/tritonserver"
    assert "--model-repository=/repo" in cmd and "--backend-directory=/backends" in cmd
    assert "--model-control-mode=explicit" in cmd
    assert cmd[-2:] == ["--load-model=a", "--load-model=b"]
    ports = {server.http_port, server.grpc_port, server.metrics_port}
    assert len(ports) == 3 and f"--http-port={server.http_port}" in cmd
    assert TritonServer(Path("/r"), host="0.0.0.0", http_port=9).http_url == "127.0.0.1:9"


def test_triton_behind_the_gate_never_draws_a_public_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """The public ports are given and bound by the gate only once Triton is up: until then
    they are free to any check, so Triton's own ports must be drawn among the others."""
    ports = [free_port() for _ in range(5)]
    monkeypatch.setattr(net, "_taken", set())
    monkeypatch.setattr(net, "listening_ports", lambda span=0: ports)
    http, grpc, metrics, *rest = ports
    server = TritonServer(Path("/r"), http_port=http, grpc_port=grpc, metrics_port=metrics,
                          body_limit=BodyLimit.of(1 << 20))  # fmt: skip
    assert {server._triton_http, server._triton_grpc} == set(rest)


def fake_install(tmp_path: Path, script: str) -> TritonInstall:
    binary = tmp_path / "tritonserver"
    binary.write_text("#!/bin/sh\n" + script + "\n")
    binary.chmod(0o755)
    (tmp_path / "backends").mkdir()
    return TritonInstall(binary, tmp_path / "backends", None)


def test_a_server_that_dies_at_start_up_is_reported(tmp_path: Path) -> None:
    server = TritonServer(tmp_path, install=fake_install(tmp_path, "exit 3"))
    with pytest.raises(BackendUnavailable, match="exited with status 3"):
        server.start(timeout=10)
    assert server.proc is None


def test_a_server_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    install = fake_install(tmp_path, "trap '' TERM\nsleep 30")
    server = TritonServer(tmp_path, install=install, stop_timeout=0.5)
    start = time.monotonic()
    with pytest.raises(BackendUnavailable, match="not ready"):
        server.start(timeout=1.0)
    took = time.monotonic() - start
    # Hang guard: the 1 s start-up timeout plus the 0.5 s stop timeout (1.5 s measured).
    assert took < 15, f"{took:.2f}s"
    assert server.proc is None
