"""The bearer token of the mutating routes, and where it comes from.

Resolution order: ``--token-file PATH``, else ``$HPS_ADMIN_TOKEN``, else the file named by
``$HPS_ADMIN_TOKEN_FILE``. With no token configured the mutating routes answer 403 (they are
disabled, never open); a missing or wrong token gets 401. The token is never logged nor
returned.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from hps.config.common import read_text
from hps.errors import ConfigError
from hps.redact import check_key

TOKEN_ENV = "HPS_ADMIN_TOKEN"
TOKEN_FILE_ENV = "HPS_ADMIN_TOKEN_FILE"


def _read(path: str | Path) -> str:
    token = read_text(Path(path), "admin token file ").strip()
    if not token:
        raise ConfigError(f"admin token file {path} is empty")
    check_key(token, f"admin token file {path}")
    return token


def resolve_token(token_file: str | None = None) -> str | None:
    """The configured token, or None when none is configured (mutations are then refused)."""
    if token_file:
        return _read(token_file)
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token:
        check_key(token, f"${TOKEN_ENV}")
        return token
    path = os.environ.get(TOKEN_FILE_ENV, "").strip()
    return _read(path) if path else None


def check_bearer(expected: str | None, authorization: str | None) -> int | None:
    """None when ``authorization`` carries the token; else the status to answer (401/403)."""
    if expected is None:
        return 403
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        return 401
    if not hmac.compare_digest(given.strip().encode(), expected.encode()):
        return 401
    return None
