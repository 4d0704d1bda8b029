"""Loopback ports: which are free (for servers HPS starts and the tests' servers)."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def port_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether a TCP server could bind ``host:port`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(*, also_free_at: int = 0, host: str = LOOPBACK) -> int:
    """A port free right now (racy by nature: use it at once). ``also_free_at``: an offset
    whose port must be free too (Redis Cluster's bus port is the port + 10000)."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if not also_free_at:
            return port
        if port + also_free_at < 65536 and port_free(port + also_free_at, host):
            return port
    raise RuntimeError(f"no free port found on {host}")
