"""Start, on this machine, what a ps.json needs for a load test; stop all of it by PID.

:func:`start_stack` reads the ps.json as a document, applies the load test's overrides
(``l2``, ``instances``, Kafka updates), starts what it names on free loopback ports —
``redis-server`` (one node, or a Redis Cluster of 3+ masters when the file lists several
addresses), the Tansu broker (Kafka protocol), ``hps serve``, ``hps consume`` when the serving
processes do not apply updates themselves, and the control plane (``hps admin``) when this
``hps`` has it — and writes the *effective* ps.json (those addresses, absolute paths) into the
run folder, which every process reads. Logs go to the run folder too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from hps.errors import BackendUnavailable, ConfigError
from hps.loadtest.runner import interrupts_deferred
from hps.net import free_port

if TYPE_CHECKING:
    from hps.testing.redis import RedisClusterServers, RedisServer

log = logging.getLogger(__name__)

REDIS_L2 = {"redis", "redis_cluster"}
EMBEDDED_L2 = {"hash_map", "parallel_hash_map"}
FAST_KAFKA = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 300}
READY_TIMEOUT_S = 300.0


Doc: TypeAlias = dict[str, Any]
"""A ps.json document as parsed JSON, edited in place before ``hps serve`` validates it."""


class Server(Protocol):
    """A server the load test starts beside the stack (Redis, the Kafka broker)."""

    def start(self) -> object: ...
    def stop(self) -> object: ...


@dataclass
class Stack:
    """Addresses of a running deployment; ``stop()`` ends what this process started."""

    config_path: Path
    triton_http: str
    triton_grpc: str
    metrics_url: str = ""
    consumer_metrics_url: str = ""  # hps consume's /metrics, when the stack runs one
    admin_url: str = ""
    brokers: str = ""
    ctr: bool = False  # the model is also served as <model>_ctr
    started: list[str] = field(default_factory=list)  # what start_stack started, in order
    _procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    _servers: list[Server] = field(default_factory=list)  # RedisServer, TansuBroker, ...

    @property
    def serve_pid(self) -> int | None:
        return next((p.pid for n, p in self._procs if n == "hps serve"), None)

    def stop(self) -> None:
        """Stop it all, whatever interrupts arrive meanwhile: SIGTERM to the process group of
        every process (the last started first), then one grace period for all of them,
        SIGKILL of each group still there after it, then the servers, in reverse order.
        A Ctrl-C or SIGTERM meanwhile is held back until everything is stopped, then
        raised (:func:`hps.loadtest.runner.interrupts_deferred`)."""
        with interrupts_deferred():
            _terminate(list(reversed(self._procs)))
            self._procs.clear()
            for server in reversed(self._servers):
                with contextlib.suppress(Exception):
                    server.stop()
            self._servers.clear()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _terminate(procs: list[tuple[str, subprocess.Popen[bytes]]], grace_s: float = 40.0) -> None:
    """SIGTERM each running process's group, wait ``grace_s`` for all of them together,
    SIGKILL the groups of those still running."""
    for _, proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for name, proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %d) ignored SIGTERM; killing its process group", name, proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _absolute(doc: Doc, base: Path) -> None:
    def fix(p: str) -> str:
        return p if not p or os.path.isabs(p) else str((base / p).resolve())

    for m in doc.get("models", []):
        m["sparse_files"] = [fix(p) for p in m.get("sparse_files", [])]
        for key in ("dense_file", "network_file"):
            if m.get(key):
                m[key] = fix(m[key])
        cache = m.get("hps_cache") or {}
        for key in ("frequency_file", "warmup_keyset"):
            if cache.get(key):
                cache[key] = fix(cache[key])
    pdb = doc.get("persistent_db") or {}
    if pdb.get("path"):
        pdb["path"] = fix(pdb["path"])


def effective_doc(
    doc: Doc,
    *,
    l2: str | None,
    instances: int | None,
    updates: bool,
    l1_refresh: str | None = None,
) -> Doc:
    """The ps.json document with the load test's overrides (addresses are set later).

    The stack is one node, whose one ``hps consume`` writes its L2 and L3: its serving L1s
    hear of updates through the node's change journal unless ``l1_refresh`` or the ps.json
    says otherwise (``update_source.hps_l1_refresh``)."""
    doc = json.loads(json.dumps(doc))
    vdb = doc.setdefault("volatile_db", {})
    if l2:
        vdb["type"] = "redis_cluster" if l2 in REDIS_L2 else l2
        if l2 in REDIS_L2:
            vdb["address"] = ",".join(["127.0.0.1:1"] * (3 if l2 == "redis_cluster" else 1))
    if instances:
        for m in doc["models"]:
            m["hps_instances"] = instances
    us = doc.get("update_source") or {}
    if updates and us.get("type", "null") == "null":
        doc["update_source"] = {
            "type": "kafka_message_queue",
            "poll_timeout_ms": 100,
            "hps_group_id": "hps-loadtest",
            "hps_kafka_config": FAST_KAFKA,
        }
    us = doc.get("update_source") or {}
    if us.get("type", "null") != "null":
        us["hps_l1_refresh"] = l1_refresh or us.get("hps_l1_refresh") or "journal"
    return doc


def needs_consumer(doc: Doc) -> bool:
    """Kafka updates that the serving processes do not apply to L2/L3 themselves."""
    if (doc.get("update_source") or {}).get("type", "null") == "null":
        return False
    embedded = (doc.get("volatile_db") or {}).get("type", "hash_map") in EMBEDDED_L2
    single = all(m.get("hps_instances", 1) == 1 for m in doc["models"])
    return not (embedded and single)


def has_admin() -> bool:
    """Whether this ``hps`` has the control plane command (``hps admin``)."""
    from hps.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return "admin" in getattr(sub, "choices", {})


def start_stack(
    config: str | Path,
    run_dir: Path,
    *,
    l2: str | None = None,
    instances: int | None = None,
    updates: bool = False,
    admin: bool = True,
    partitions: int = 1,
    l1_refresh: str | None = None,
) -> Stack:
    """Start everything the ps.json needs; on failure, stop what was started and raise.

    The update topics get ``partitions`` partitions each (when the ps.json's broker is one
    this function starts; topics that exist keep theirs)."""
    from hps.config import parse_config

    run_dir = run_dir.resolve()  # redis-server changes into its --dir before opening its log
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        doc = json.loads(Path(config).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{config}: {exc}") from None
    doc = effective_doc(doc, l2=l2, instances=instances, updates=updates, l1_refresh=l1_refresh)
    _absolute(doc, Path.cwd())
    parse_config(doc, str(config))  # a bad file fails here, before anything starts
    http, grpc_, metrics = free_port(), free_port(), free_port()
    ps_path = run_dir / "ps.json"
    stack = Stack(ps_path, f"127.0.0.1:{http}", f"127.0.0.1:{grpc_}",
                  f"http://127.0.0.1:{metrics}/metrics")  # fmt: skip
    try:
        _start_servers(stack, doc, run_dir)
        _write_private(ps_path, json.dumps(doc, indent=1) + "\n")  # it may hold passwords
        cfg = parse_config(doc, str(ps_path))
        stack.ctr = any(m.dense_file.endswith(".npz") for m in cfg.models)
        if stack.brokers:
            from hps.updates.codec import topic_name
            from hps.updates.kafka import ensure_topics

            # Topics exist before the serving processes subscribe to them.
            topics = [topic_name(t.model, t.table) for t in cfg.tables]
            ensure_topics(stack.brokers, topics, num_partitions=partitions)
        _spawn(stack, "hps serve", run_dir, ["serve", "--config", str(ps_path),
               "--http-port", str(http), "--grpc-port", str(grpc_), "--metrics-port",
               str(metrics)])  # fmt: skip
        _wait_http(stack, "hps serve", f"http://{stack.triton_http}/v2/health/ready")
        if needs_consumer(doc):
            port = free_port()
            _spawn(stack, "hps consume", run_dir, ["consume", "--config", str(ps_path),
                   "--metrics-port", str(port)])  # fmt: skip
            stack.consumer_metrics_url = f"http://127.0.0.1:{port}/metrics"
        if admin and has_admin():
            port = free_port()
            admin_args = ["admin", "--config", str(ps_path), "--host", "127.0.0.1",
                          "--port", str(port), "--triton-url", stack.triton_http]  # fmt: skip
            # It reads Triton's hit rates from the metrics port this stack chose.
            env = {**os.environ, "HPS_TRITON_METRICS_URL": stack.metrics_url}
            _spawn(stack, "hps admin", run_dir, admin_args, env)
            stack.admin_url = f"http://127.0.0.1:{port}"
            _wait_http(stack, "hps admin", f"{stack.admin_url}/healthz")
    except BaseException:
        stack.stop()
        raise
    return stack


def _start_servers(stack: Stack, doc: Doc, run_dir: Path) -> None:
    vdb = doc.get("volatile_db") or {}
    if vdb.get("type") in REDIS_L2:
        from hps.testing.redis import RedisClusterServers, RedisServer

        n = len([a for a in str(vdb.get("address", "")).split(",") if a.strip()])
        server: RedisClusterServers | RedisServer = (
            RedisClusterServers(run_dir / "redis", masters=max(3, n))
            if n > 1
            else RedisServer(run_dir / "redis")
        )
        stack._servers.append(server)
        _start(server, "redis-server", run_dir / "redis")
        stack.started.append(f"redis-server x{len(server.addresses)}")
        vdb["address"] = ",".join(server.addresses)
    us = doc.get("update_source") or {}
    if us.get("type", "null") != "null":
        from hps.testing.kafka import TansuBroker

        broker = TansuBroker(run_dir / "tansu")
        stack._servers.append(broker)
        _start(broker, "the Tansu broker", run_dir / "tansu")
        stack.started.append("tansu (Kafka protocol)")
        us["brokers"] = stack.brokers = broker.bootstrap


def _start(server: Server, what: str, logs: Path) -> None:
    try:
        server.start()
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        raise BackendUnavailable(f"could not start {what}: {exc} (logs in {logs})") from None


def _spawn(
    stack: Stack, name: str, run_dir: Path, args: list[str], env: dict[str, str] | None = None
) -> None:
    logfile = run_dir / f"{name.split()[-1]}.log"
    with open(logfile, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hps.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own group: a stuck one is killed with its children
        )
    stack._procs.append((name, proc))
    stack.started.append(f"{name} (pid {proc.pid}, log {logfile})")


def _wait_http(stack: Stack, name: str, url: str, timeout_s: float = READY_TIMEOUT_S) -> None:
    proc = next(p for n, p in stack._procs if n == name)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BackendUnavailable(
                f"{name} exited with status {proc.returncode}; see its log in the run folder"
            )
        with (
            contextlib.suppress(urllib.error.URLError, OSError),
            urllib.request.urlopen(url, timeout=2) as resp,
        ):
            if resp.status == 200:
                return
        time.sleep(0.5)
    raise BackendUnavailable(f"{name} not ready at {url} after {timeout_s:.0f}s")


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (mode 0600, an existing file too)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
