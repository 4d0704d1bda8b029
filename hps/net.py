"""Loopback ports: which are free (for servers HPS starts and the tests' servers)."""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

LOOPBACK = "127.0.0.1"
LOWEST_PORT = 10_000  # below: ports of well-known services are more likely
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")

# Ports this process handed out or was told it will bind (claim): a port chosen but not
# bound yet is free to any check, so the next choice could be it (e.g. Triton's internal
# gRPC port drawn equal to the public one its gate binds only once Triton is up).
_taken: set[int] = set()
_taken_lock = threading.Lock()


def port_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether a TCP server could bind ``host:port`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def listening_ports(span: int = 0) -> range | None:
    """Ports for servers below the kernel's ephemeral range, leaving ``span`` above each
    free of that range too; ``None`` where the range is unknown or too little lies below it.

    A port the kernel hands out for ``bind(0)`` comes from the ephemeral range, the same
    range every outgoing connection takes its local port from: between checking such a port
    and a server binding it, any client on the machine may take it (seen: Triton's gRPC port
    taken while the test's own clients connected). Below that range only servers bind."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    ports = range(LOWEST_PORT, low - span)
    return ports if len(ports) >= 1000 else None


def claim(*ports: int) -> None:
    """Ports this process will bind (e.g. given on its command line): :func:`free_port`
    never returns them."""
    with _taken_lock:
        _taken.update(p for p in ports if p)


def free_port(*, also_free_at: int = 0, host: str = LOOPBACK) -> int:
    """A port free right now (racy by nature: use it at once), below the ephemeral range
    where it is known (:func:`listening_ports`), and never one this process handed out or
    claimed before (:func:`claim`). ``also_free_at``: an offset whose port must be free too
    (Redis Cluster's bus port is the port + 10000)."""
    ports = listening_ports(also_free_at)
    with _taken_lock:
        for _ in range(200):
            if ports is not None:
                port = random.choice(ports)
                if port in _taken or not port_free(port, host):
                    continue
            else:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind((host, 0))
                    port = int(s.getsockname()[1])
                if port in _taken:
                    continue
            if also_free_at and not (
                port + also_free_at < 65536 and port_free(port + also_free_at, host)
            ):
                continue
            _taken.add(port)
            return port
    raise RuntimeError(f"no free port found on {host}")
