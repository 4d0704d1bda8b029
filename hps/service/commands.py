"""``hps admin``: the control plane (FastAPI served by uvicorn)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

METRICS_URL_ENV = "HPS_TRITON_METRICS_URL"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "admin",
        help="serve the control plane (health, stats, import, lookup, delete, warm-up, reload)",
        description="A FastAPI service beside `hps serve`. Mutating routes need the bearer "
        "token from --token-file, else $HPS_ADMIN_TOKEN, else the file $HPS_ADMIN_TOKEN_FILE "
        "names; without one they answer 403. Triton's admin key (reloads) comes from "
        "$HPS_ADMIN_KEY, $HPS_ADMIN_KEY_FILE, else the key file `hps serve` keeps beside the "
        "ps.json. Triton's metrics are read from "
        f"${METRICS_URL_ENV} (default: the --triton-url host, port 8002). See "
        "docs/control-plane.md.",
    )
    p.add_argument("--config", required=True, help="ps.json (the one `hps serve` serves)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: all)")
    p.add_argument("--port", type=int, default=8081)
    p.add_argument("--triton-url", default="127.0.0.1:8000", help="Triton's HTTP address")
    p.add_argument("--token-file", help="file holding the bearer token of mutating routes")
    p.set_defaults(func=_admin)


def _admin(args: argparse.Namespace) -> int:
    import uvicorn

    from hps.redact import protect
    from hps.service.app import create_app
    from hps.service.auth import resolve_token
    from hps.service.state import AdminState
    from hps.service.triton_admin import TritonAdmin
    from hps.triton.serving import serving_config
    from hps.updates.kafka import check_update_source

    protect()  # from here on no log record holds a registered secret
    config = serving_config(args.config)
    protect(config)
    check_update_source(config)  # a bad Kafka setting is a config error now, not a 500 later
    token = resolve_token(args.token_file)
    admin_key = admin_key_source(Path(args.config).resolve().parent)
    protect(None, token)
    metrics_url = os.environ.get(METRICS_URL_ENV) or None
    triton = TritonAdmin(args.triton_url, metrics_url, admin_key)
    app = create_app(AdminState(config, token, triton))
    # uvicorn's access log shows paths and statuses only, never the Authorization header;
    # its loggers, configured here, are scrubbed too (the record factory of hps.redact).
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="info"))
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0 if server.started else 1  # not started: e.g. the port is taken (logged)


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
