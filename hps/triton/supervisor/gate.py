"""The request-size gate: nginx in front of Triton's HTTP and gRPC ports.

Triton 2.51 has no bound on a request's size: a client sending 8 MB requests costs the
server 13-26 ms of CPU each (gRPC frontend, protobuf parse, copy into the Python backend)
before the model can refuse them, and on a small machine that CPU is taken from every
other client. The gate refuses a body over :class:`BodyLimit` before Triton sees any of it
(at once when HTTP announces a Content-Length; nginx still reads and discards the rest of
an HTTP/2 body), so a refused request costs Triton nothing.

- The limit is derived from the served models (:meth:`BodyLimit.for_config`): the largest
  request their key limits allow, in binary, plus 64 KiB; over HTTP, that request's largest
  JSON body (tensors as JSON text: each element as long as its dtype prints, plus 64 KiB).
  ``hps serve --max-request-mb`` overrides it (:meth:`BodyLimit.of`).
- A gRPC request over the limit gets status RESOURCE_EXHAUSTED with a message naming the
  limit; an HTTP one gets 413 with Triton's JSON error body, so clients show the reason.
- A compressed request is refused whatever its size (:data:`COMPRESSED`): nginx measures a
  body as sent and Triton inflates it (gRPC's ``grpc-encoding``, HTTP's
  ``Content-Encoding``: a 194 KB gzip request made Triton inflate 200 MB). gRPC gets
  UNIMPLEMENTED, gRPC's own status for a compression a server does not take; HTTP 415.
- Triton then listens on loopback ports of its own; the gate listens where Triton would.
  nginx dies with the process that starts it, like Triton (hps.triton.supervisor.lifecycle).
- nginx logs at its error level: to ``log_file`` if given, else with ``summarize`` (``hps
  serve`` without ``--verbose``) to ``error.log`` in its folder, of which
  :class:`hps.triton.supervisor.gate_log.GateLog` reports counts, else to stderr.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hps.errors import BackendUnavailable, ConfigError
from hps.triton.supervisor.address import client_host, host_port, resolve_host
from hps.triton.supervisor.gate_log import GateLog
from hps.triton.supervisor.lifecycle import check_ports, spawn_child

if TYPE_CHECKING:
    from hps.config import ModelConfig, PSConfig

HEADROOM = 64 * 1024  # protocol framing, tensor names and shapes, the JSON header of HTTP
# Bytes of one tensor element in binary, and at most as JSON text with its ", " separator:
# -9223372036854775808, -2147483648, and a float32 printed as the float64 it is, 17
# significant digits (-1.2345678901234567e-38; tritonclient's, Python's and Go's JSON alike).
BINARY_BYTES = {"INT64": 8, "INT32": 4, "FP32": 4}
JSON_CHARS = {"INT64": 20 + 2, "INT32": 11 + 2, "FP32": 23 + 2}
JSON_ROW_CHARS = 4  # "[", "]" and ", " of each row of a tensor sent as nested arrays
# The most JSON text per binary byte of any request tensor, for a limit given in binary
# bytes alone: FP32's in rows of one element (a dense feature per sample), 7.25.
JSON_PER_BYTE = max((JSON_CHARS[t] + JSON_ROW_CHARS) / BINARY_BYTES[t] for t in BINARY_BYTES)
UNLIMITED_MODEL_BYTES = 64 * 1024**2  # a model without per-table key limits
NGINX_PATHS = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")
STOP_TIMEOUT_S = 10.0
# Body buffers hold the limit and one more HTTP/2 window: a body is refused before it could
# spill into a temporary file (which nginx's workers, another user under root, may not write).
SPARE = 256 * 1024
START_FAILURE_LINES = 5
# The request headers of a compressed body that Triton would inflate: HTTP's Content-Encoding
# (Triton's HTTP frontend: gzip, deflate); gRPC's grpc-encoding, and Content-Encoding there
# too (older gRPC cores inflated it as "stream compression"). Absent or identity: as sent.
COMPRESSED = {"http": ("content_encoding",), "grpc": ("grpc_encoding", "content_encoding")}


@dataclass(frozen=True)
class BodyLimit:
    """Largest request body the gate lets through, per protocol, in bytes."""

    grpc: int
    http: int

    @classmethod
    def of(cls, binary: int) -> BodyLimit:
        """``binary`` bytes over gRPC; over HTTP, the largest JSON body of a request of that
        many bytes: every byte JSON text at FP32's rate, :data:`JSON_PER_BYTE`."""
        return cls(grpc=binary, http=math.ceil(binary * JSON_PER_BYTE))

    @classmethod
    def for_config(cls, config: PSConfig) -> BodyLimit:
        """The largest request the models' limits allow (docs/security.md), in binary and as
        JSON, plus :data:`HEADROOM`: keys (int64), per-table counts or row offsets (int32)
        for ``max_batch_size + 1`` rows and the dense features of a CTR request (fp32), as
        many elements of each as :func:`largest_request` says."""
        grpc = http = 0
        for m in config.models:
            elements = largest_request(m)
            grpc = max(grpc, sum(n * BINARY_BYTES[t] for t, n in elements.items()))
            # Tensors are [rows, n]: as nested JSON arrays, each row adds its brackets.
            rows = (m.max_batch_size + 1) * len(elements) * JSON_ROW_CHARS
            http = max(http, sum(n * JSON_CHARS[t] for t, n in elements.items()) + rows)
        return cls(grpc=grpc + HEADROOM, http=http + HEADROOM)

    def describe(self) -> str:
        return f"gRPC {self.grpc / 2**20:.2f} MiB, HTTP {self.http / 2**20:.2f} MiB"


def largest_request(m: ModelConfig) -> dict[str, int]:
    """Elements per dtype of the largest request ``m``'s limits allow: its tables' key
    limits in int64 keys, ``(max_batch_size + 1) x tables`` int32 counts (NUMKEYS) or row
    offsets (ROWINDEX), ``max_batch_size x maxnum_des_feature_per_sample`` fp32 dense
    features (DES). A model without per-table key limits: keys up to
    :data:`UNLIMITED_MODEL_BYTES` of the whole request."""
    limits = [t.max_keys_per_request for t in m.tables]
    counts = (m.max_batch_size + 1) * len(limits)
    dense = m.max_batch_size * m.maxnum_des_feature_per_sample
    if all(limits):
        keys = sum(limits)
    else:
        rest = UNLIMITED_MODEL_BYTES - counts * BINARY_BYTES["INT32"] - dense * BINARY_BYTES["FP32"]
        keys = -(-max(0, rest) // BINARY_BYTES["INT64"])
    return {"INT64": keys, "INT32": counts, "FP32": dense}


def find_nginx() -> Path:
    """The nginx binary (PATH, then Debian's /usr/sbin, which users' PATH often lacks)."""
    found = shutil.which("nginx") or next((p for p in NGINX_PATHS if os.access(p, os.X_OK)), None)
    if found is None:
        raise ConfigError(
            "nginx not found: the request-size gate needs it (apt-get install nginx-light); "
            "or serve without the gate: hps serve --max-request-mb 0 (docs/security.md)"
        )
    return Path(found)


def _has_error_log_flag(nginx: Path) -> bool:
    """``-e`` (nginx >= 1.19.5) keeps nginx off its compiled-in log path at start-up."""
    done = subprocess.run([str(nginx), "-v"], capture_output=True, text=True, check=False)
    found = re.search(r"nginx/(\d+)\.(\d+)\.(\d+)", done.stderr + done.stdout)
    return found is not None and tuple(map(int, found.groups())) >= (1, 19, 5)


def _grpc_message(text: str) -> str:
    return text.replace('"', "'")


def render_config(gate: RequestGate) -> str:
    """nginx.conf of a gate: everything under its folder, nothing cached on disk."""
    d = gate.workdir
    lim = gate.limit
    grpc_refusal = _grpc_message(
        f"request of more than {lim.grpc:,} bytes refused by the request-size gate "
        "(the key limits of the served models: docs/security.md)"
    )
    http_refusal = (
        f'{{"error":"request of more than {lim.http:,} bytes refused by the request-size '
        'gate (the key limits of the served models: docs/security.md)"}'
    )
    compressed = (
        "compressed request refused by the request-size gate: it measures a body as sent, "
        "send it uncompressed (docs/security.md)"
    )
    temp = " ".join(
        f"{k}_temp_path {d / k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""# written by hps (hps/triton/supervisor/gate.py); nginx in front of one tritonserver
worker_processes {gate.workers};
daemon off;
pid {d / "nginx.pid"};
error_log {gate.error_log} error;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    server_tokens off;
    {temp}
    upstream triton_grpc {{ server 127.0.0.1:{gate.upstream_grpc}; keepalive 64; }}
    upstream triton_http {{ server 127.0.0.1:{gate.upstream_http}; keepalive 64; }}
    # A whole typical answer per buffer and frame (1,024 samples x 26 tables: 1.7 MB out):
    # nginx's 4-16 KB defaults halved the floor's throughput.
    http2_chunk_size 256k;
    # nginx ends a client connection after 1,000 requests by default (HTTP/2: a GOAWAY that
    # failed a gRPC request in flight under load, "Stream removed"): keep connections.
    keepalive_requests 100000000;
{_encoding_maps()}
    server {{
        listen {host_port(gate.host, gate.grpc_port)} http2;
        client_max_body_size {lim.grpc};
        client_body_buffer_size {lim.grpc + SPARE};
        grpc_buffer_size 1m;
        client_body_timeout 60s;
        grpc_read_timeout 3600s;
        grpc_send_timeout 3600s;
        location / {{
            # nginx streams gRPC bodies to Triton as they arrive; the (empty) mirror makes
            # it read the whole body first, so a refused one never reaches Triton.
            mirror /_hps_gate_read_body;
            grpc_pass grpc://triton_grpc;
        }}
        location = /_hps_gate_read_body {{ internal; return 204; }}
        error_page 413 = @too_large;
        location @too_large {{
            default_type application/grpc;
            add_header grpc-status 8 always;
            add_header grpc-message "{grpc_refusal}" always;
            return 204;
        }}
{_refuse_encoded("grpc")}
        error_page 415 = @compressed;
        location @compressed {{
            default_type application/grpc;
            add_header grpc-status 12 always;
            add_header grpc-message "{_grpc_message(compressed)}" always;
            return 204;
        }}
    }}
    server {{
        listen {host_port(gate.host, gate.http_port)};
        client_max_body_size {lim.http};
        client_body_buffer_size {lim.http + SPARE};  # whole bodies, in memory, before Triton
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_buffering off;
        proxy_buffer_size 1m;
        proxy_buffers 4 1m;
        proxy_busy_buffers_size 2m;
        proxy_read_timeout 3600s;
        location / {{ proxy_pass http://triton_http; }}
        error_page 413 = @too_large;
        location @too_large {{
            default_type application/json;
            return 413 '{http_refusal}';
        }}
{_refuse_encoded("http")}
        error_page 415 = @compressed;
        location @compressed {{
            default_type application/json;
            add_header Accept-Encoding identity always;
            return 415 '{{"error":"{compressed}"}}';
        }}
    }}
}}
"""


def _encoding_maps() -> str:
    """``$hps_<header>`` is 1 when the request's header names a coding other than identity
    (nginx matches map strings without regard to case)."""
    headers = sorted({h for names in COMPRESSED.values() for h in names})
    return "\n".join(
        f'    map $http_{h} $hps_{h} {{ "" 0; identity 0; default 1; }}' for h in headers
    )


def _refuse_encoded(protocol: str) -> str:
    """Server-level checks, before any location and before nginx reads the body."""
    return "\n".join(f"        if ($hps_{h}) {{ return 415; }}" for h in COMPRESSED[protocol])


@dataclass
class RequestGate:
    """nginx on ``host:http_port`` / ``host:grpc_port`` forwarding to Triton's loopback
    ``upstream_http`` / ``upstream_grpc``, refusing bodies over ``limit``; where it logs:
    see the module's notes. ``host`` becomes numeric (hps.triton.supervisor.address): ``::``
    is IPv6-only to nginx, and is probed at ::1."""

    limit: BodyLimit
    workdir: Path
    upstream_http: int
    upstream_grpc: int
    http_port: int
    grpc_port: int
    host: str = "127.0.0.1"
    log_file: Path | None = None
    summarize: bool = False
    workers: int = field(default_factory=lambda: max(1, min(4, (os.cpu_count() or 1) // 4)))
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    summary: GateLog | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.host = resolve_host(self.host)

    @property
    def error_log(self) -> str:
        if self.log_file:
            return str(self.log_file)
        return str(self.workdir / "error.log") if self.summarize else "stderr"

    def start(self, timeout: float = 10.0) -> RequestGate:
        """Start nginx and wait until both ports accept connections."""
        nginx = find_nginx()
        # nginx binds one port while it retries another in use: check both first.
        check_ports(self.host, {"HTTP": self.http_port, "gRPC": self.grpc_port})
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "nginx.conf"
        conf.write_text(render_config(self))
        cmd = [str(nginx), "-p", str(self.workdir), "-c", str(conf)]
        if _has_error_log_flag(nginx):
            cmd += ["-e", self.error_log]
        self.proc = spawn_child(cmd, self.log_file)
        deadline = time.monotonic() + timeout
        while not all(self._accepts(p) for p in (self.http_port, self.grpc_port)):
            if self.proc.poll() is not None:
                raise BackendUnavailable(
                    f"nginx (the request-size gate) exited with status {self.proc.returncode}"
                    f" at start-up{self._said()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise BackendUnavailable(f"nginx (the request-size gate) not up in {timeout}s")
            time.sleep(0.05)
        if self.summarize and not self.log_file:
            self.summary = GateLog(Path(self.error_log))
            self.summary.start()
        return self

    def _said(self) -> str:
        """Where to read why nginx failed, or (its folder is removed then) its last lines."""
        if self.log_file:
            return f"; see {self.log_file}"
        if not self.summarize:
            return ""  # it said so on stderr
        try:
            lines = Path(self.error_log).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "".join(f"\n  {line}" for line in lines[-START_FAILURE_LINES:])

    def _accepts(self, port: int) -> bool:
        try:
            with socket.create_connection((client_host(self.host), port), timeout=0.5):
                return True
        except OSError:
            return False

    def stop(self) -> list[str]:
        """SIGTERM (nginx's fast shutdown), SIGKILL of its group after a timeout."""
        proc, self.proc = self.proc, None
        if proc is None:
            return []
        problems = []
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                problems.append(f"nginx ignored SIGTERM for {STOP_TIMEOUT_S:.0f}s")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # workers of a master that is gone
        proc.wait()
        if proc.returncode not in (0, -signal.SIGKILL) and not problems:
            problems.append(f"nginx exited with status {proc.returncode}")
        summary, self.summary = self.summary, None
        if summary is not None:
            summary.stop()  # what nginx logged last, counted
        return problems

    def __enter__(self) -> RequestGate:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
