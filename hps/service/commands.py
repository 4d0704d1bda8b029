"""``hps admin``: the control plane (FastAPI served by uvicorn)."""

from __future__ import annotations

import argparse
import os
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

    from hps.service.app import create_app
    from hps.service.auth import resolve_token
    from hps.service.state import AdminState
    from hps.service.triton_admin import TritonAdmin
    from hps.triton.admin import resolve_key
    from hps.triton.deploy import serving_config

    config = serving_config(args.config)
    token = resolve_token(args.token_file)
    # hps serve's key: $HPS_ADMIN_KEY, $HPS_ADMIN_KEY_FILE, else the file beside the ps.json
    key = resolve_key(Path(args.config).resolve().parent)
    triton = TritonAdmin(args.triton_url, os.environ.get(METRICS_URL_ENV) or None, key)
    app = create_app(AdminState(config, token, triton))
    # uvicorn's access log shows paths and statuses only, never the Authorization header.
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0
