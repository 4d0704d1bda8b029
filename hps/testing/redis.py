"""Throwaway ``redis-server`` processes: one node, or a Redis Cluster of masters.

Used by the pytest fixtures (tests/fixtures/redis_servers.py) and by ``hps bench storage``.
Servers bind to free loopback ports, keep nothing on disk (``--save '' --appendonly no``),
daemonize with a pidfile and are stopped by that PID. ``stop()`` then ``start()`` brings a
server back on the same port (empty: nothing is persisted; a cluster node keeps its
``nodes.conf`` and so rejoins its cluster).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hps.net import free_port

if TYPE_CHECKING:
    import redis

HOST = "127.0.0.1"
CLUSTER_BUS_OFFSET = 10_000  # Redis Cluster's bus listens on port + 10000
SLOTS = 16384


def redis_server_binary() -> str:
    """Path of ``redis-server``; raises RuntimeError naming the fix when it is missing."""
    path = shutil.which("redis-server")
    if path is None:
        raise RuntimeError("redis-server not found on PATH (apt-get install redis-server)")
    return path


def _alive(pid: int) -> bool:
    # A daemonized server is reparented to PID 1, which may reap it late: a zombie is dead.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)


class _PortTaken(Exception):
    pass


class RedisNode:
    """One ``redis-server`` process on a fixed loopback port."""

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        *,
        cluster: bool = False,
        extra_args: Sequence[str] = (),
        password: str | None = None,
        username: str | None = None,
        client_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """``extra_args`` go to redis-server after ours ("{port}" in them is this node's port);
        ``client_kwargs`` (e.g. TLS settings) go to the admin clients of :meth:`client`."""
        self._pick_port = port is None
        self._started = False
        bus = CLUSTER_BUS_OFFSET if cluster else 0
        self.port = port if port is not None else free_port(also_free_at=bus)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cluster = cluster
        self.extra_args = list(extra_args)
        self.client_kwargs = dict(client_kwargs or {})
        self.password = password
        self.username = username
        self.pidfile = self.workdir / "redis.pid"
        self.logfile = self.workdir / "redis.log"
        self.pid: int | None = None

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self, timeout: float = 10.0) -> None:
        """Launch the server (daemonized) and wait until it accepts connections.

        A port picked by us that another process grabbed before the first start is replaced
        by a fresh one; a restart always reuses the port it had.
        """
        if self.running:
            return
        retries = 3 if self._pick_port and not self._started else 0
        for attempt in range(retries + 1):
            try:
                self._launch(timeout)
            except _PortTaken:
                if attempt == retries:
                    raise RuntimeError(f"port {self.port} is taken") from None
                self.port = free_port(also_free_at=CLUSTER_BUS_OFFSET if self.cluster else 0)
                continue
            self._started = True
            return

    def _launch(self, timeout: float) -> None:
        self.pidfile.unlink(missing_ok=True)
        self.logfile.write_text("")
        args = [
            redis_server_binary(),
            "--port", str(self.port), "--bind", HOST,
            "--save", "", "--appendonly", "no",
            "--daemonize", "yes", "--pidfile", str(self.pidfile),
            "--logfile", str(self.logfile), "--dir", str(self.workdir),
        ]  # fmt: skip
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-node-timeout", "2000"]  # fmt: skip
        args += [a.replace("{port}", str(self.port)) for a in self.extra_args]
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
        try:
            _wait(self._accepting, timeout, f"redis-server on {self.address}")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{self.logfile.read_text()[-2000:]}") from None
        self.pid = int(self.pidfile.read_text())

    def _accepting(self) -> bool:
        if not self.pidfile.exists() or not self.pidfile.read_text().strip():
            # redis-server writes its pidfile only once it listens (an empty file for a
            # moment); a bind failure is logged.
            if "Address already in use" in self.logfile.read_text():
                raise _PortTaken(self.port)
            return False
        try:
            with socket.create_connection((HOST, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    @property
    def running(self) -> bool:
        return self.pid is not None and _alive(self.pid)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the server by its PID and wait for it to exit (SIGKILL after timeout)."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        try:
            _wait(lambda: not _alive(pid), timeout, f"redis-server pid {pid} to exit")
        except RuntimeError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait(lambda: not _alive(pid), 5.0, f"redis-server pid {pid} to die")

    def client(self, **kwargs: Any) -> redis.Redis:
        """A plain redis-py client to this node (with its credentials)."""
        import redis

        return redis.Redis(
            host=HOST, port=self.port, username=self.username, password=self.password,
            socket_timeout=10, **{**self.client_kwargs, **kwargs},
        )  # fmt: skip

    def flush(self) -> None:
        with contextlib.closing(self.client()) as c:
            c.flushall()


class RedisServer:
    """A single Redis node: ``.address``, ``.addresses``, ``start()``, ``stop()``, ``flush()``."""

    def __init__(self, workdir: Path, **node_kwargs: Any) -> None:
        self.node = RedisNode(workdir, **node_kwargs)

    @property
    def address(self) -> str:
        return self.node.address

    @property
    def addresses(self) -> list[str]:
        return [self.node.address]

    @property
    def running(self) -> bool:
        return self.node.running

    def start(self) -> None:
        self.node.start()

    def stop(self) -> None:
        self.node.stop()

    def flush(self) -> None:
        self.node.flush()


class RedisClusterServers:
    """A Redis Cluster of ``masters`` nodes, no replicas; ``.address`` is the first node."""

    def __init__(self, workdir: Path, masters: int = 3, **node_kwargs: Any) -> None:
        self.nodes = [
            RedisNode(Path(workdir) / f"node{i}", cluster=True, **node_kwargs)
            for i in range(masters)
        ]
        self._created = False

    @property
    def address(self) -> str:
        return self.nodes[0].address

    @property
    def addresses(self) -> list[str]:
        return [n.address for n in self.nodes]

    @property
    def running(self) -> bool:
        return all(n.running for n in self.nodes)

    def start(self, timeout: float = 30.0) -> None:
        """Start every node; the first time, create the cluster. Waits for cluster_state:ok."""
        for node in self.nodes:
            node.start()
        if not self._created:
            self._create()
            self._created = True
        _wait(self._state_ok, timeout, "cluster_state:ok on every node")

    def _create(self) -> None:
        """Split the 16384 slots evenly (CLUSTER ADDSLOTSRANGE) and make the nodes MEET."""
        n = len(self.nodes)
        for i, node in enumerate(self.nodes):
            lo, hi = i * SLOTS // n, (i + 1) * SLOTS // n - 1
            with contextlib.closing(node.client()) as c:
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
        with contextlib.closing(self.nodes[0].client()) as c:
            for node in self.nodes[1:]:
                c.execute_command("CLUSTER", "MEET", HOST, node.port)

    def _state_ok(self) -> bool:
        for node in self.nodes:
            try:
                with contextlib.closing(node.client(socket_connect_timeout=1)) as c:
                    info = c.execute_command("CLUSTER", "INFO")
            except Exception:
                return False
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text:
                return False
        return True

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def flush(self) -> None:
        for node in self.nodes:
            node.flush()


@contextlib.contextmanager
def throwaway_redis(cluster: bool = False) -> Iterator[RedisServer | RedisClusterServers]:
    """A Redis node (or a 3-master cluster) in a temporary folder, stopped on exit."""
    with tempfile.TemporaryDirectory(prefix="hps-redis-") as tmp:
        server: RedisServer | RedisClusterServers = (
            RedisClusterServers(Path(tmp)) if cluster else RedisServer(Path(tmp))
        )
        try:
            server.start()
            yield server
        finally:
            server.stop()
