"""The cleanup of dead servers' leftovers, and ports in use named before a start."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hps.errors import ConfigError
from hps.tempdirs import OWNER_FILE
from hps.triton.supervisor import lifecycle


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_clean_stale_removes_what_dead_owners_left(tmp_path: Path) -> None:
    dead = dead_pid()
    stale = lifecycle.SHM_DIR / f"hpspb_{dead}_0a1b2c3d_x"
    live = lifecycle.SHM_DIR / f"hpspb_{os.getpid()}_0a1b2c3d_y"
    for region in (stale, live):
        region.write_bytes(b"\0" * 16)
    old = tmp_path / "hps-repo-old"
    old.mkdir()
    (old / OWNER_FILE).write_text(str(dead))
    mine = tmp_path / "hps-triton-mine"
    mine.mkdir()
    (mine / OWNER_FILE).write_text(str(os.getpid()))
    unmarked = tmp_path / "hps-repo-unmarked"
    unmarked.mkdir()
    try:
        removed = lifecycle.clean_stale(tmp_path)
        assert {stale, old} <= set(removed)  # and any other dead server's regions
        assert live.exists() and mine.exists() and unmarked.exists()
    finally:
        stale.unlink(missing_ok=True)
        live.unlink(missing_ok=True)


def wait_zombie(pid: int) -> None:
    """Wait until our child ``pid`` has ended (left unreaped: a zombie)."""
    deadline = time.monotonic() + 30  # hang guard
    while (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child never ended"
        time.sleep(0.01)


def test_a_zombie_owner_is_dead(tmp_path: Path) -> None:
    """An owner that ended but is not reaped yet (an orphan waits for init) is dead: what
    it left is removed."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_zombie(proc.pid)
        assert lifecycle.pid_alive(os.getpid()) and not lifecycle.pid_alive(proc.pid)
        left = tmp_path / "hps-repo-zombie"
        left.mkdir()
        (left / OWNER_FILE).write_text(str(proc.pid))
        assert left in lifecycle.clean_stale(tmp_path) and not left.exists()
    finally:
        proc.wait()


def test_a_port_in_use_is_named() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"gRPC port {port} on 127.0.0.1 is in use"):
            lifecycle.check_ports("127.0.0.1", {"HTTP": 0, "gRPC": port})
    lifecycle.check_ports("127.0.0.1", {"HTTP": port})  # free again


def test_a_port_given_twice_is_named_before_any_is_tried() -> None:
    with pytest.raises(ConfigError, match="the HTTP and metrics ports are both 8000"):
        lifecycle.check_ports("nonexistent.invalid", {"HTTP": 8000, "gRPC": 0, "metrics": 8000})
    lifecycle.check_ports("127.0.0.1", {"HTTP": 0, "gRPC": 0})  # 0: any free port, each


def test_a_host_that_does_not_resolve_is_not_called_busy() -> None:
    with pytest.raises(ConfigError, match="--host nonexistent.invalid cannot be resolved"):
        lifecycle.check_ports("nonexistent.invalid", {"HTTP": 8000})


def test_an_address_not_of_this_machine_is_not_called_busy() -> None:
    with pytest.raises(ConfigError, match=r"cannot listen on 192\.0\.2\.1 port 8000 \(HTTP\)"):
        lifecycle.check_ports("192.0.2.1", {"HTTP": 8000})  # TEST-NET-1: no one's address


def test_an_ipv6_address_with_a_zone_is_refused_as_one_triton_cannot_bind() -> None:
    """tritonserver's gRPC server cannot bind ``[fe80::1%eth0]`` (it exits at start-up)."""
    with pytest.raises(ConfigError, match=r"--host fe80::1%lo: an IPv6 address with a zone"):
        lifecycle.check_ports("fe80::1%lo", {"HTTP": 8000})


def test_an_ipv6_port_is_checked_as_triton_binds_it() -> None:
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"HTTP port {port} on ::1 is in use"):
            lifecycle.check_ports("::1", {"HTTP": port})
