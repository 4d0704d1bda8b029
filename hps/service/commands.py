"""``hps admin``: the control plane (FastAPI served by uvicorn)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

from hps.cli import port, positive_float, positive_int

# defaults of the limits (hps.service.connections, hps.service.jobs hold the same: a test checks);
# not imported from there: the CLI loads without the `admin` extra (uvicorn, starlette)
MAX_CONNECTIONS = 1024
READ_TIMEOUT_S = 10.0
MAX_JOBS = 16
MAX_STAGED_BYTES = 64 * 1024**3
METRICS_URL_ENV = "HPS_TRITON_METRICS_URL"
STATE_DIR_ENV = "HPS_ADMIN_STATE_DIR"
DEFAULT_STATE_DIR = "hps-admin"
NO_TOKEN = (
    "hps admin: no bearer token (--token-file, $HPS_ADMIN_TOKEN, $HPS_ADMIN_TOKEN_FILE): "
    "mutating routes answer 403 until hps admin is started with one"
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "admin",
        help="serve the control plane (health, stats, import, lookup, delete, warm-up, reload, "
        "model versions, models added and removed at runtime)",
        description="A FastAPI service beside `hps serve`. Mutating routes need the bearer "
        "token from --token-file, else $HPS_ADMIN_TOKEN, else the file $HPS_ADMIN_TOKEN_FILE "
        "names; without one they answer 403. Triton's admin key (reloads) comes from "
        "$HPS_ADMIN_KEY, $HPS_ADMIN_KEY_FILE, else the key file `hps serve` keeps beside the "
        "ps.json. Triton's metrics are read from "
        f"${METRICS_URL_ENV} (default: the --triton-url host, port 8002). See "
        "docs/control-plane.md.",
    )
    p.add_argument("--config", required=True, help="ps.json (the one `hps serve` serves)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: 127.0.0.1; 0.0.0.0: all)",
    )
    p.add_argument("--port", type=port, default=8081, help="port to listen on (default: 8081)")
    p.add_argument(
        "--triton-url",
        default="127.0.0.1:8000",
        help="Triton's HTTP address (host:port; http:// optional)",
    )
    p.add_argument("--token-file", help="file holding the bearer token of mutating routes")
    p.add_argument(
        "--repository",
        help="the model repository `hps serve` serves, where activating a model version "
        "writes its folders (default: the one `hps serve` writes beside the node's L3 or "
        "state, <l3 path>.hps-repository)",
    )
    p.add_argument(
        "--state-dir",
        help="where job records, staged uploads and warm-up keysets are kept across restarts "
        f"(default: ${STATE_DIR_ENV}, else {DEFAULT_STATE_DIR}/ beside the ps.json)",
    )
    p.add_argument(
        "--max-connections",
        type=positive_int,
        default=MAX_CONNECTIONS,
        help="open connections at most (also kept below the file-descriptor limit); past it "
        "the oldest idle connection is closed (default: %(default)s)",
    )
    p.add_argument(
        "--read-timeout",
        type=positive_float,
        default=READ_TIMEOUT_S,
        help="seconds a connection may stay open without a request in progress "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--max-jobs",
        type=positive_int,
        default=MAX_JOBS,
        help="import jobs queued or running at most; past it 429 (default: %(default)s)",
    )
    p.add_argument(
        "--max-staged-gb",
        type=positive_float,
        default=MAX_STAGED_BYTES / 1024**3,
        help="GiB of uploads staged for pending jobs at most; past it 429, a larger upload "
        "413 (default: %(default)s)",
    )
    p.set_defaults(func=_admin)


def _admin(args: argparse.Namespace) -> int:
    import uvicorn

    from hps.redact import protect
    from hps.service.app import create_app
    from hps.service.auth import resolve_token
    from hps.service.connections import BACKLOG, ConnectionGuard, fd_bound, limit_repeated_logs
    from hps.service.jobs import JobRegistry
    from hps.service.paths import register_secret_file
    from hps.service.state import AdminState
    from hps.service.triton_admin import TritonAdmin
    from hps.triton.serving import serving_config
    from hps.triton.supervisor.lifecycle import check_ports
    from hps.updates.kafka import check_update_source

    check_ports(args.host, {"control-plane": args.port})  # before any start-up work
    protect()  # from here on no log record holds a registered secret
    config = serving_config(args.config)
    protect(config)
    check_update_source(config)  # a bad Kafka setting is a config error now, not a 500 later
    token = resolve_token(args.token_file)
    if args.token_file:  # confined paths never name it (hps.service.paths)
        register_secret_file(args.token_file)
    if token is None:
        print(NO_TOKEN, file=sys.stderr, flush=True)
    admin_key = admin_key_source(Path(args.config).resolve().parent)
    protect(None, token)
    metrics_url = os.environ.get(METRICS_URL_ENV) or None
    triton = TritonAdmin(args.triton_url, metrics_url, admin_key)
    jobs = JobRegistry(args.max_jobs, int(args.max_staged_gb * 1024**3))
    state_dir = state_dir_of(args)
    guard = ConnectionGuard(fd_bound(args.max_connections), args.read_timeout)
    repository = Path(args.repository).resolve() if args.repository else None
    state = AdminState(config, token, triton, state_dir=state_dir, jobs=jobs, repository=repository)
    app = create_app(state, guard)
    # uvicorn's access log shows paths and statuses only, never the Authorization header;
    # its loggers, configured here, are scrubbed too (the record factory of hps.redact).
    uv_config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="info",
        http=guard.protocol(),
        backlog=BACKLOG,
    )
    limit_repeated_logs()  # after uvicorn configured its loggers: accept errors once per 10 s
    server = uvicorn.Server(uv_config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0 if server.started else 1  # not started: e.g. the port is taken (logged)


def state_dir_of(args: argparse.Namespace) -> Path:
    """``--state-dir``, else ``$HPS_ADMIN_STATE_DIR``, else ``hps-admin/`` beside the ps.json;
    created. A read-only default (a ConfigMap's folder) falls back to a temporary folder,
    with a warning: jobs then do not outlive the process."""
    import tempfile

    from hps.errors import ConfigError

    named = args.state_dir or os.environ.get(STATE_DIR_ENV)
    folder = Path(named) if named else Path(args.config).resolve().parent / DEFAULT_STATE_DIR
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        if named:
            raise ConfigError(f"--state-dir {folder}: not writable: {exc.strerror}") from None
        tmp = Path(tempfile.mkdtemp(prefix="hps-admin-"))
        print(
            f"hps admin: {folder} is not writable ({exc.strerror}); job records and staged "
            f"uploads go to {tmp} and do not survive a restart: pass --state-dir",
            file=sys.stderr,
            flush=True,
        )
        return tmp
    return folder


def admin_key_source(state_dir: Path) -> Callable[[], str | None]:
    """Triton's admin key as ``hps serve`` has it now: ``$HPS_ADMIN_KEY``, the file
    ``$HPS_ADMIN_KEY_FILE`` names, else the key file in ``state_dir``; read again at every
    reload (``hps serve`` writes a new key at every start), each key read registered for
    redaction.

    A malformed or unreadable key is an error now, at start. A file that
    ``$HPS_ADMIN_KEY_FILE`` names but that does not exist yet is not: beside ``hps serve``
    in a pod (helm/hps: its ``--state-dir`` on a volume both containers mount) the control
    plane may start before ``hps serve`` writes its key; until it does, a reload answers
    503 naming the file.
    """
    from hps.errors import BackendUnavailable
    from hps.triton.admin_key import KEY_ENV, KEY_FILE_ENV, resolve_key

    def current() -> str | None:
        named = os.environ.get(KEY_FILE_ENV)
        if named and os.environ.get(KEY_ENV) is None and not Path(named).exists():
            raise BackendUnavailable(
                f"admin key file {named} (${KEY_FILE_ENV}) does not exist yet: "
                "hps serve writes it when it starts"
            )
        return resolve_key(state_dir)

    try:
        current()
    except BackendUnavailable as exc:
        print(f"hps admin: {exc}; it is read at every reload", file=sys.stderr, flush=True)
    return current
