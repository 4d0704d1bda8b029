"""Connecting to Redis (one node or a Redis Cluster) and translating redis-py's errors.

``connect(cfg)`` probes the configured addresses (``INFO cluster``) and returns a plain
``redis.Redis`` for a single node or a ``redis.cluster.RedisCluster`` for a cluster. Every
socket has connect and read timeouts (``hps_socket_timeout_s``) and retries at most once, so
an unreachable Redis surfaces as :class:`BackendUnavailable` within seconds, never a hang.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import Connection, ConnectionPool, SSLConnection
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ClusterDownError,
    RedisClusterException,
    RedisError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from hps.config import VolatileDBConfig
from hps.errors import BackendError, BackendUnavailable, ConfigError

log = logging.getLogger(__name__)

Client = redis.Redis | RedisCluster


class _Common(TypedDict, total=False):
    """Connection settings every node's connections get."""

    socket_timeout: float
    socket_connect_timeout: float
    username: str | None
    password: str


_UNAVAILABLE = (
    RedisConnectionError,
    RedisTimeoutError,
    ClusterDownError,
    TryAgainError,
    RedisClusterException,
    OSError,
)


@contextlib.contextmanager
def translated(where: str) -> Iterator[None]:
    """Re-raise redis-py errors as hps errors (unreachable / timed out → BackendUnavailable)."""
    try:
        yield
    except (AuthenticationError, AuthorizationError) as exc:
        raise BackendError(f"{where}: Redis refused the credentials: {exc}") from exc
    except RedisConnectionError as exc:
        if _certificate_refused(exc):  # a configuration problem: retrying will not help
            raise BackendError(f"{where}: TLS certificate refused: {exc}") from exc
        raise BackendUnavailable(f"{where}: Redis unavailable: {exc}") from exc
    except _UNAVAILABLE as exc:
        raise BackendUnavailable(f"{where}: Redis unavailable: {exc}") from exc
    except RedisError as exc:
        raise BackendError(f"{where}: Redis error: {exc}") from exc


def _certificate_refused(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(5):  # redis-py raises ConnectionError from the ssl error's context
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def parse_addresses(address: str) -> list[tuple[str, int]]:
    """``"h1:p1,h2:p2"`` → ``[("h1", p1), ("h2", p2)]``; a port defaults to 6379."""
    nodes = []
    if "@" in address or "://" in address:  # never echoed: it may hold a password
        raise ConfigError(
            "volatile_db.address: give host:port[,host:port...], not a URL (a password "
            "goes in volatile_db.password, or hps_password_env)"
        )
    for part in address.split(","):
        part = part.strip()
        if not part:
            continue
        host, sep, port = part.rpartition(":")
        if not sep:
            host, port = part, "6379"
        try:
            port_no = int(port)
        except ValueError:
            port_no = -1
        if not host or not 0 < port_no < 65536:
            raise ConfigError(f"volatile_db.address: {part!r} is not host:port")
        nodes.append((host.strip("[]"), port_no))
    if not nodes:
        raise ConfigError("volatile_db.address: no Redis address given")
    return nodes


def _tls_connection_class(cfg: VolatileDBConfig) -> type[SSLConnection]:
    """An SSLConnection carrying our TLS settings, so single nodes and cluster nodes share it.

    HugeCTR's defaults name files that rarely exist (``cacertbundle.crt``…): a default path
    that is missing is left out (system CAs, no client certificate); an explicitly configured
    one that is missing is a ConfigError. An explicitly set ``tls_server_name_identification``
    is sent as SNI and checked against the server certificate; otherwise the address host is.
    """
    explicit = cfg.model_fields_set
    files: dict[str, str | None] = {}
    for key, kwarg in (
        ("tls_ca_certificate", "ssl_ca_certs"),
        ("tls_client_certificate", "ssl_certfile"),
        ("tls_client_key", "ssl_keyfile"),
    ):
        path = getattr(cfg, key)
        if Path(path).is_file():
            files[kwarg] = path
        elif key in explicit:
            raise ConfigError(f"volatile_db.{key}: no such file {path!r}")
    server_name = (
        cfg.tls_server_name_identification
        if ("tls_server_name_identification" in explicit)
        else None
    )
    settings: dict[str, object] = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
    settings.update(files)

    class TLSConnection(SSLConnection):
        def __init__(self, **kwargs: Any) -> None:  # redis-py's connection keywords
            super().__init__(**{**settings, **kwargs})

        def _wrap_socket_with_ssl(self, sock: socket.socket) -> ssl.SSLSocket:
            if server_name is None:
                return super()._wrap_socket_with_ssl(sock)
            host, self.host = self.host, server_name  # redis-py sends self.host as SNI
            try:
                return super()._wrap_socket_with_ssl(sock)
            finally:
                self.host = host

    return TLSConnection


def _probe(host: str, port: int, common: _Common, tls: type[SSLConnection] | None) -> bool:
    """Whether the node at host:port runs in cluster mode (raises redis errors)."""
    pool = ConnectionPool(host=host, port=port, connection_class=tls or Connection, **common)
    client = redis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0))
    try:
        info = client.info("cluster")
        return bool(int(info.get("cluster_enabled", 0)))
    finally:
        client.close()
        pool.disconnect()


def connect(cfg: VolatileDBConfig) -> tuple[Client, bool]:
    """A client for ``cfg.address`` and whether it is a Redis Cluster."""
    nodes = parse_addresses(cfg.address)
    timeout = cfg.hps_socket_timeout_s
    common: _Common = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if cfg.password:
        common.update({"username": cfg.user_name or None, "password": cfg.password})
    tls = _tls_connection_class(cfg) if cfg.enable_tls else None
    where = f"connecting to Redis at {cfg.address}"
    cluster: bool | None = None
    errors: list[str] = []
    for host, port in nodes:
        try:
            with translated(where):
                cluster = _probe(host, port, common, tls)
            break
        except BackendUnavailable as exc:
            errors.append(str(exc.__cause__))
    if cluster is None:
        raise BackendUnavailable(f"{where}: no node reachable ({'; '.join(errors)})")
    log.info("Redis at %s: %s", cfg.address, "a cluster" if cluster else "a single node")
    if not cluster:
        if len(nodes) > 1:
            raise ConfigError(
                f"volatile_db.address lists {len(nodes)} nodes but {host}:{port} is not in "
                "cluster mode (cluster_enabled:0); give one address for a single Redis"
            )
        pool = ConnectionPool(host=host, port=port, connection_class=tls or Connection, **common)
        return redis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 1)), False
    retry = Retry(NoBackoff(), 1)
    with translated(where):
        if tls is None:
            startup = [ClusterNode(h, p) for h, p in nodes]
            return RedisCluster(startup_nodes=startup, retry=retry, **common), True
        # Only the from_url path of redis-py builds node pools from ``connection_class``.
        rest = [ClusterNode(h, p) for h, p in nodes if (h, p) != (host, port)]
        url = node_url(host, port)
        return RedisCluster(
            url=url, startup_nodes=rest, retry=retry, connection_class=tls, **common
        ), True


def node_url(host: str, port: int) -> str:
    """``redis://host:port``, an IPv6 address in brackets (``parse_addresses`` strips them)."""
    return f"redis://[{host}]:{port}" if ":" in host else f"redis://{host}:{port}"


def close(client: Client) -> None:
    """Close ``client`` and every socket it opened: a single node's pool too, which
    ``redis.Redis(connection_pool=...)`` leaves open until it is garbage collected."""
    client.close()
    if isinstance(client, redis.Redis):
        client.connection_pool.disconnect()
