"""A tritonserver process: its command line, started and stopped by PID."""

from __future__ import annotations

import io
import subprocess
import time
from pathlib import Path

import pytest

from hps import net
from hps.errors import BackendUnavailable
from hps.net import free_port
from hps.triton.supervisor.gate import BodyLimit
from hps.triton.supervisor.install import TritonInstall
from hps.triton.supervisor.output import TritonOutput
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


def flags(server: TritonServer) -> dict[str, str]:
    """The address flags of its tritonserver command line."""
    cmd = server.command(Path("/backends"))
    return {k[2:]: v for k, _, v in (a.partition("=") for a in cmd) if k.endswith("-address")}


def test_a_host_name_reaches_triton_as_a_numeric_address() -> None:
    """Triton's HTTP and metrics servers take a numeric address only: given ``localhost``
    they listened on 255.255.255.255 while the banner printed a loopback URL."""
    install = TritonInstall(Path("/x/tritonserver"), Path("/x"), None)
    direct = TritonServer(Path("/r"), host="localhost", install=install)
    assert flags(direct) == {"http-address": "127.0.0.1", "grpc-address": "127.0.0.1",
                             "metrics-address": "127.0.0.1"}  # fmt: skip
    gated = TritonServer(
        Path("/r"), host="localhost", install=install, body_limit=BodyLimit.of(1 << 20)
    )
    assert flags(gated)["metrics-address"] == "127.0.0.1"
    assert gated.metrics_url == f"http://127.0.0.1:{gated.metrics_port}/metrics"


def test_an_ipv6_host_is_spelled_for_each_listener_and_bracketed_in_urls() -> None:
    install = TritonInstall(Path("/x/tritonserver"), Path("/x"), None)
    direct = TritonServer(Path("/r"), host="::1", install=install)
    assert flags(direct) == {"http-address": "ipv6:::1", "grpc-address": "[::1]",
                             "metrics-address": "ipv6:::1"}  # fmt: skip
    assert direct.http_url == f"[::1]:{direct.http_port}"
    assert direct.grpc_url == f"[::1]:{direct.grpc_port}"
    assert direct.metrics_url == f"http://[::1]:{direct.metrics_port}/metrics"
    gated = TritonServer(Path("/r"), host="::", install=install, body_limit=BodyLimit.of(1 << 20))
    assert flags(gated) == {"http-address": "127.0.0.1", "grpc-address": "127.0.0.1",
                            "metrics-address": "ipv6:::"}  # fmt: skip
    # `::` is IPv6-only to nginx and Triton's HTTP servers: clients here reach it at ::1
    assert gated.http_url == f"[::1]:{gated.http_port}"


def test_shutdown_names_a_failed_load_as_the_cause_of_triton_s_status_1(tmp_path: Path) -> None:
    """Triton 2.51 counts a model whose load failed as live until it exits: its shutdown
    waits out the exit timeout and exits 1. ``hps serve`` saw the failed load in Triton's
    output and says so, instead of an unexplained unclean shutdown."""
    output = TritonOutput(err=io.StringIO())
    output.ready()
    output.feed('E1129 01:47:49.746011 15233 model_lifecycle.cc:642] "failed to load '
                "'emb' version 1: Internal: ConfigError: ps.json: invalid JSON\"")  # fmt: skip
    server = TritonServer(tmp_path, output=output)
    server.proc = subprocess.Popen(["sh", "-c", "exit 1"], start_new_session=True)
    server.proc.wait()
    problems = server.stop()
    assert len(problems) == 1
    assert "status 1 after waiting out its exit timeout" in problems[0]
    assert "failed load of emb" in problems[0] and "docs/security.md" in problems[0]
    # any other exit status is not explained by it
    assert server._exit_problem(2) == "tritonserver exited with status 2"
