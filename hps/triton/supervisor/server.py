"""Start, probe and stop a ``tritonserver`` process.

One :class:`TritonServer` is used by ``hps serve``, the test fixture and ``hps bench triton``.
Which tritonserver, its backends folder and its environment: :mod:`hps.triton.supervisor.install`.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from hps.errors import BackendUnavailable, HPSError
from hps.net import claim, free_port
from hps.redact import redact_args, register
from hps.tempdirs import owned_tempdir
from hps.triton.admin_key import restricted_args
from hps.triton.client import ModelControl
from hps.triton.supervisor.address import client_host, host_port, resolve_host, triton_addresses
from hps.triton.supervisor.gate import BodyLimit, RequestGate
from hps.triton.supervisor.install import TritonInstall, find_triton, prepare_backends, server_env
from hps.triton.supervisor.lifecycle import (
    reap_group,
    regions,
    shm_prefix,
    spawn_child,
)
from hps.triton.supervisor.orphan_guard import OrphanGuard
from hps.triton.supervisor.output import TritonOutput

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0


@dataclass
class TritonServer:
    """A tritonserver child process on chosen (or free) loopback ports.

    ``explicit`` selects ``--model-control-mode explicit`` with ``load_models`` loaded at
    start (models can then be loaded and unloaded through the model-control API).
    Triton's model-repository, shared-memory, trace and logging APIs are restricted to
    requests carrying ``admin_key`` (random unless given; see hps.triton.admin_key). The
    server dies with the thread that started it (hps.triton.supervisor.lifecycle), within
    the grace of a guard process (hps.triton.supervisor.orphan_guard).

    With a ``body_limit``, the request-size gate (hps.triton.supervisor.gate) listens on
    ``host`` at the HTTP and gRPC ports and Triton behind it on loopback ports of its own;
    the URLs below are the gate's. The gate starts once Triton answers (before, nginx would
    log a refused connection for every probe). Metrics are served by Triton directly.
    ``host`` is resolved once to a numeric ``address``, which every listener and URL takes
    (hps.triton.supervisor.address: brackets for IPv6, ``::`` reached at ::1).

    Triton's output goes to ``log_file``, else through ``output``
    (hps.triton.supervisor.output: what ``hps serve`` shows of it), else to this process's
    stdout/stderr. The gate's goes to ``log_file`` too, else, with an ``output`` that is
    not verbose, to a file of which counts are shown (hps.triton.supervisor.gate_log).
    """

    repository: Path
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    host: str = "127.0.0.1"
    explicit: bool = False
    load_models: list[str] = field(default_factory=list)
    log_file: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    install: TritonInstall | None = None
    stop_timeout: float = STOP_TIMEOUT_S
    admin_key: str = ""
    body_limit: BodyLimit | None = None
    output: TritonOutput | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    gate: RequestGate | None = field(default=None, init=False)
    shm_prefix: str = field(default_factory=shm_prefix, init=False)
    address: str = field(default="", init=False)  # ``host``, numeric
    _workdir: Path | None = field(default=None, init=False)
    _guard: OrphanGuard | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.admin_key = self.admin_key or secrets.token_urlsafe(24)
        self.address = resolve_host(self.host)
        claim(self.http_port, self.grpc_port, self.metrics_port)  # not drawn again below
        self.http_port = self.http_port or free_port()
        self.grpc_port = self.grpc_port or free_port()
        self.metrics_port = self.metrics_port or free_port()
        gated = self.body_limit is not None
        self._triton_http = free_port() if gated else self.http_port
        self._triton_grpc = free_port() if gated else self.grpc_port

    @property
    def client_host(self) -> str:
        """Where clients on this machine reach it (a wildcard address is not one)."""
        return client_host(self.address)

    @property
    def http_url(self) -> str:
        return host_port(self.client_host, self.http_port)

    @property
    def grpc_url(self) -> str:
        return host_port(self.client_host, self.grpc_port)

    @property
    def metrics_url(self) -> str:
        return f"http://{host_port(self.client_host, self.metrics_port)}/metrics"

    def command(self, backends: Path) -> list[str]:
        install = self.install or find_triton()
        http_host, grpc_host = triton_addresses(self.address)
        metrics_host = http_host  # Triton's metrics server is an HTTP server (libevhtp) too
        if self.body_limit is not None:  # behind the gate, on loopback
            http_host = grpc_host = "127.0.0.1"
        cmd = [
            str(install.binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={backends}",
            f"--http-address={http_host}",
            f"--http-port={self._triton_http}",
            f"--grpc-address={grpc_host}",
            f"--grpc-port={self._triton_grpc}",
            f"--metrics-address={metrics_host}",
            f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--strict-readiness=true",
            "--exit-timeout-secs=5",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            *restricted_args(self.admin_key),
        ]
        if self.output is not None and self.log_file is None:
            cmd += self.output.triton_args()
        if self.explicit:
            cmd.append("--model-control-mode=explicit")
            cmd += [f"--load-model={m}" for m in self.load_models]
        return cmd + self.extra_args

    def start(self, timeout: float = READY_TIMEOUT_S) -> TritonServer:
        """Start the server and wait until /v2/health/ready answers 200."""
        install = self.install = self.install or find_triton()
        self._workdir = owned_tempdir("hps-triton-")
        backends = prepare_backends(install, self._workdir / "backends")
        cmd = self.command(backends)
        register(self.admin_key)  # never in a log line, ours or Triton's as we relay it
        log.debug("starting %s", " ".join(redact_args(cmd)))
        relay = self.output if self.log_file is None else None
        env = server_env(install)
        if relay is not None:
            env["PYTHONUNBUFFERED"] = "1"  # the stubs' prints reach the pipe as they come
        self._guard = OrphanGuard().start()  # Triton and the gate end even if we are killed
        self.proc = spawn_child(cmd, self.log_file, env, pipe=relay is not None)
        self._guard.watch(self.proc.pid)  # its group: Triton and its stubs
        if relay is not None:
            relay.attach(self.proc)
        try:
            if self.body_limit is not None:
                self.wait_ready(timeout, f"127.0.0.1:{self._triton_http}")
                self.gate = RequestGate(
                    self.body_limit,
                    self._workdir / "gate",
                    upstream_http=self._triton_http,
                    upstream_grpc=self._triton_grpc,
                    http_port=self.http_port,
                    grpc_port=self.grpc_port,
                    host=self.address,
                    log_file=self.log_file,
                    summarize=self.output is not None and not self.output.verbose,
                ).start()
                if self.gate.proc is not None:
                    self._guard.watch(self.gate.proc.pid)
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def is_ready(self, address: str | None = None) -> bool:
        """Whether the server at ``address`` (default: where clients reach it) is ready."""
        try:
            url = f"http://{address or self.http_url}/v2/health/ready"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout: float = READY_TIMEOUT_S, address: str | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise BackendUnavailable(
                    f"tritonserver exited with status {self.proc.returncode} during start-up"
                    + (f"; see {self.log_file}" if self.log_file else "")
                )
            if self.is_ready(address):
                time.sleep(0.2)  # a port clash makes a fresh Triton exit right after binding
                if self.proc is not None and self.proc.poll() is not None:
                    continue  # the answer came from another server: report our exit above
                return
            time.sleep(0.2)
        raise BackendUnavailable(f"tritonserver not ready after {timeout:.0f}s")

    def wait(self) -> tuple[str, int]:
        """Block until tritonserver or its gate exits: which of them, and its exit status."""
        assert self.proc is not None, "server not started"
        procs = {"tritonserver": self.proc}
        if self.gate is not None and self.gate.proc is not None:
            procs["nginx (the request-size gate)"] = self.gate.proc
        while True:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    return name, proc.returncode
            time.sleep(0.5)

    @property
    def control(self) -> ModelControl:
        """The model-control API of this server, with its admin key."""
        return ModelControl(self.http_url, self.admin_key)

    def stop(self, drain: bool = True) -> list[str]:
        """Drain, SIGTERM, then SIGKILL of its process group after ``stop_timeout`` (by PID).

        Draining unloads every model first (explicit mode): in-flight requests finish, new
        ones get an error, and Triton then exits without models to wait for. Returns what
        was not clean (empty: a clean stop); leftovers are removed either way.
        """
        problems: list[str] = []
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            if drain and self.explicit:
                try:
                    if not self.control.drain(self.stop_timeout):
                        problems.append(f"models still loaded after {self.stop_timeout:.0f}s")
                except HPSError as exc:
                    problems.append(f"drain failed: {exc}")
            problems += self._stop_gate()  # its keep-alive connections would delay Triton's exit
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                log.warning("tritonserver %d ignored SIGTERM; killing it", proc.pid)
                problems.append(f"tritonserver ignored SIGTERM for {self.stop_timeout:.0f}s")
                # The group is the session we created for it: Triton and its model stubs.
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc is not None:
            reap_group(proc.pid)
            if self.output is not None and self.log_file is None:
                self.output.close()  # its last lines read: the pipe's writers are gone
            if proc.returncode != 0:
                problems.append(self._exit_problem(proc.returncode))
            left = regions(self.shm_prefix)
            if left:
                problems.append(f"{len(left)} shared-memory regions left behind (removed)")
            for region in left:
                region.unlink(missing_ok=True)
        problems += self._stop_gate()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        guard, self._guard = self._guard, None
        if guard is not None:
            guard.stop()  # after the groups it watched are gone
        return problems

    def _exit_problem(self, status: int) -> str:
        """Triton's exit status, with its known cause where ``output`` saw one: Triton 2.51
        counts a model whose load failed (e.g. a reload whose new instances failed) as live
        until it exits, waits for it for its exit timeout, then exits 1."""
        failed = self.output.failed_loads if self.output is not None else []
        if status != 1 or not failed:
            return f"tritonserver exited with status {status}"
        return (
            f"tritonserver exited with status 1 after waiting out its exit timeout: the "
            f"known cost of the failed load of {', '.join(failed)}, which Triton 2.51 counts "
            "as a live model until it exits (docs/security.md)"
        )

    def _stop_gate(self) -> list[str]:
        gate, self.gate = self.gate, None
        return gate.stop() if gate is not None else []

    def __enter__(self) -> TritonServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
