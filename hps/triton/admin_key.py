"""The admin key that guards Triton's administrative APIs (docs/security.md).

Triton's model-repository API loads a model from file contents sent in the request (a
Python model runs as the server's user), its shared-memory APIs let a client point an
output at memory the server uses, and its logging and trace APIs change server settings.
Every server HPS starts restricts these APIs, on HTTP and gRPC, to requests carrying the
header :data:`ADMIN_HEADER` with the admin key; inference, health, metadata, model
configuration and statistics stay open.

The key, by precedence: env ``HPS_ADMIN_KEY``; else the file named by env
``HPS_ADMIN_KEY_FILE``; else the key file of the deployment's state directory (see
:func:`key_file_for`), into which ``hps serve`` writes a fresh random key at every start
(:func:`ensure_key`: mode 0600, the old file replaced atomically, never reused).
:func:`resolve_key` is what HPS's own clients (``hps reload``, the control plane) call:
they read the current file. Every key resolved here is registered with
:func:`hps.redact.register`, so no log line of the process shows it.

tritonserver takes the key only on its command line (``--http-restricted-api``), which
every process of the same PID namespace can read (docs/security.md says how to contain it).

On gRPC Triton expects the header as ``triton-grpc-protocol-<header>``
(:func:`grpc_headers`); on HTTP as is (:func:`http_headers`).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from hps.config.common import read_text
from hps.errors import ConfigError
from hps.redact import check_key, register

ADMIN_HEADER = "hps-admin-key"
KEY_ENV = "HPS_ADMIN_KEY"
KEY_FILE_ENV = "HPS_ADMIN_KEY_FILE"
KEY_FILE_NAME = "hps-admin-key"
GRPC_PREFIX = "triton-grpc-protocol-"
# Triton's names (tritonserver --help): closed to requests without the key.
RESTRICTED_APIS = ("model-repository", "shared-memory", "trace", "logging")


def _read(path: Path) -> str:
    key = read_text(path, "admin key file ").strip()
    _check(key, str(path))
    register(key)
    return key


def _check(key: str, where: str) -> None:
    if not key or any(c.isspace() or c in ",:=" for c in key):
        raise ConfigError(
            f"admin key from {where} must be non-empty, without spaces, ',', ':' or '='"
        )
    check_key(key, f"admin key from {where}")


def key_file_for(state_dir: str | Path) -> Path:
    """Where ``hps serve`` keeps a generated key for a deployment's state directory."""
    return Path(state_dir) / KEY_FILE_NAME


def resolve_key(state_dir: str | Path | None = None) -> str | None:
    """The admin key from the environment, else from ``state_dir``'s key file; None if none."""
    env = os.environ.get(KEY_ENV)
    if env is not None:
        _check(env.strip(), f"${KEY_ENV}")
        register(env.strip())
        return env.strip()
    named = os.environ.get(KEY_FILE_ENV)
    if named:
        return _read(Path(named))
    if state_dir is not None and key_file_for(state_dir).is_file():
        return _read(key_file_for(state_dir))
    return None


def ensure_key(state_dir: str | Path) -> tuple[str, Path | None]:
    """The key to serve with, and the file it is in (None: it came from ``$HPS_ADMIN_KEY``).

    A key from the environment (``HPS_ADMIN_KEY``, or the file ``HPS_ADMIN_KEY_FILE``
    names) is used as is. Otherwise a fresh random key is written to ``state_dir``'s key
    file at every call: a new file of mode 0600 renamed over the old one, so a reader sees
    the old key or the new one, whole, and a key that leaked with an old server's command
    line dies with it.
    """
    if os.environ.get(KEY_ENV) is not None:
        return str(resolve_key()), None
    named = os.environ.get(KEY_FILE_ENV)
    if named:
        return _read(Path(named)), Path(named)
    path = key_file_for(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(32)
    register(key)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(key + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return key, path


def restricted_args(key: str) -> list[str]:
    """tritonserver options closing :data:`RESTRICTED_APIS` to requests without ``key``."""
    _check(key, "the caller")
    apis = ",".join(RESTRICTED_APIS)
    return [
        f"--http-restricted-api={apis}:{ADMIN_HEADER}={key}",
        f"--grpc-restricted-protocol={apis}:{ADMIN_HEADER}={key}",
    ]


def http_headers(key: str | None) -> dict[str, str]:
    return {ADMIN_HEADER: key} if key else {}


def grpc_headers(key: str | None) -> dict[str, str]:
    return {GRPC_PREFIX + ADMIN_HEADER: key} if key else {}
