"""Connecting to Redis (one node or a Redis Cluster) and translating redis-py's errors.

``connect(cfg)`` probes the configured addresses (``INFO cluster``) and returns a plain
``redis.Redis`` for a single node or a ``redis.cluster.RedisCluster`` for a cluster. Every
socket has connect and read timeouts (``hps_socket_timeout_s``) and retries at most once, so
an unreachable Redis surfaces as :class:`BackendUnavailable` within seconds, never a hang.

Inside :func:`one_timeout_per_node` (the scope of one store call) a node that timed out once
is not waited on again: redis-py re-sends the commands of a cluster pipeline that timed out
one by one, each after re-reading the cluster's layout, and each would wait out the timeout
on the frozen node again; they fail at once instead (:class:`_TimeoutScope`).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import AbstractConnection, Connection, ConnectionPool, SSLConnection
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ClusterDownError,
    NoPermissionError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from hps.config import VolatileDBConfig
from hps.errors import AccessRefused, BackendError, BackendUnavailable, ConfigError

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


_TIMED_OUT: contextvars.ContextVar[set[tuple[str, int]] | None] = contextvars.ContextVar(
    "hps_redis_timed_out", default=None
)
"""The nodes (host, port) that timed out in the current :func:`one_timeout_per_node` scope."""


@contextlib.contextmanager
def one_timeout_per_node() -> Iterator[None]:
    """The scope of one store call: once a socket of a node timed out in it, every later
    connect, send or read to that node in it fails at once with a redis-py TimeoutError
    (other nodes are used as usual: a cluster's layout is re-read from them). Nested scopes
    are one."""
    if _TIMED_OUT.get() is not None:
        yield
        return
    token = _TIMED_OUT.set(set())
    try:
        yield
    finally:
        _TIMED_OUT.reset(token)


class _TimeoutScope(AbstractConnection):
    """A connection that honours :func:`one_timeout_per_node`."""

    host: str
    port: int

    def _skip_if_timed_out(self) -> None:
        seen = _TIMED_OUT.get()
        if seen is not None and (self.host, self.port) in seen:
            self.disconnect()  # a reply may be pending on it
            raise RedisTimeoutError(
                f"Timeout: {self.host}:{self.port} timed out earlier in this call (not "
                "waited on again)"
            )

    def _timed_out(self) -> None:
        seen = _TIMED_OUT.get()
        if seen is not None:
            seen.add((self.host, self.port))

    def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        if self._sock is None:
            self._skip_if_timed_out()
        try:
            super().connect_check_health(*args, **kwargs)
        except RedisTimeoutError:
            self._timed_out()
            raise

    def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        self._skip_if_timed_out()
        try:
            super().send_packed_command(*args, **kwargs)
        except RedisTimeoutError:
            self._timed_out()
            raise

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        self._skip_if_timed_out()
        try:
            return super().read_response(*args, **kwargs)
        except RedisTimeoutError:
            self._timed_out()
            raise


class _Connection(_TimeoutScope, Connection):
    """A plain TCP connection that honours :func:`one_timeout_per_node`."""


@contextlib.contextmanager
def translated(where: str) -> Iterator[None]:
    """Re-raise redis-py errors as hps errors (unreachable / timed out → BackendUnavailable).
    Messages carry Redis's (or redis-py's) own error text and the command's name, never its
    arguments (:func:`error_text`)."""
    try:
        yield
    except (AuthenticationError, AuthorizationError) as exc:
        raise AccessRefused(f"{where}: Redis refused the credentials: {error_text(exc)}") from exc
    except NoPermissionError as exc:
        raise AccessRefused(f"{where}: Redis refused the command: {error_text(exc)}") from exc
    except RedisConnectionError as exc:
        if _certificate_refused(exc):  # a configuration problem: retrying will not help
            raise BackendError(f"{where}: TLS certificate refused: {error_text(exc)}") from exc
        raise BackendUnavailable(f"{where}: Redis unavailable: {error_text(exc)}") from exc
    except _UNAVAILABLE as exc:
        raise BackendUnavailable(f"{where}: Redis unavailable: {error_text(exc)}") from exc
    except RedisError as exc:
        raise BackendError(f"{where}: Redis error: {error_text(exc)}") from exc


_PIPELINE_HEAD = "Command # "
_PIPELINE_TAIL = ") of pipeline caused error: "
_MAX_TEXT = 500


def error_text(exc: BaseException) -> str:
    """``exc``'s message without the command arguments redis-py puts in front of an error
    of a pipeline (``Command # 2 (HSET <key> <row bytes>...) of pipeline caused error:
    <Redis's text>``): Redis's text and the command's name, ``"OutOfMemoryError: <text>
    (HSET)"`` (the class names the prefix redis-py took off Redis's text). Characters that
    are not printable become ``?``; the text is cut at 500 characters."""
    text = str(exc)
    command = ""
    if text.startswith(_PIPELINE_HEAD) and _PIPELINE_TAIL in text:
        head, _, text = text.rpartition(_PIPELINE_TAIL)  # row bytes may spell anything
        words = head[len(_PIPELINE_HEAD) :].partition("(")[2].split(maxsplit=1)
        command = words[0] if words and words[0].isalpha() else ""
    text = "".join(c if c.isprintable() else "?" for c in text[:_MAX_TEXT])
    if isinstance(exc, ResponseError) and type(exc) is not ResponseError:
        text = f"{type(exc).__name__}: {text}"  # redis-py cut the prefix (OOM, READONLY...)
    return f"{text} ({command.upper()})" if command else text


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

    class TLSConnection(_TimeoutScope, SSLConnection):
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
        pool = ConnectionPool(host=host, port=port, connection_class=tls or _Connection, **common)
        return redis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 1)), False
    retry = Retry(NoBackoff(), 1)
    with translated(where):
        # Only the from_url path of redis-py builds node pools from ``connection_class``.
        rest = [ClusterNode(h, p) for h, p in nodes if (h, p) != (host, port)]
        url = node_url(host, port)
        return RedisCluster(
            url=url, startup_nodes=rest, retry=retry, connection_class=tls or _Connection, **common
        ), True


DEFAULT_MAX_BULK_BYTES = 512 * 1024 * 1024
"""Redis's default ``proto-max-bulk-len``: the longest string one argument of a command may be."""


def max_bulk_bytes(client: Client) -> int:
    """The server's ``proto-max-bulk-len`` (the smallest of a cluster's masters), read with
    ``CONFIG GET``; :data:`DEFAULT_MAX_BULK_BYTES` where Redis refuses it (managed services,
    an ACL user without ``CONFIG``) or it cannot be read."""
    found: list[Any]
    try:
        if isinstance(client, RedisCluster):
            replies: Any = client.config_get(
                "proto-max-bulk-len", target_nodes=RedisCluster.PRIMARIES
            )
            found = list(replies.values())  # a reply per master
        else:
            found = [client.config_get("proto-max-bulk-len")]
        limits = [
            int(v)
            for reply in found
            if isinstance(reply, dict)
            for k, v in reply.items()
            if (k.decode() if isinstance(k, bytes) else str(k)) == "proto-max-bulk-len"
        ]
    except (RedisError, ValueError) as exc:
        why = error_text(exc)
        log.info("Redis: proto-max-bulk-len not readable (%s); assuming the default", why)
        return DEFAULT_MAX_BULK_BYTES
    return min(limits) if limits else DEFAULT_MAX_BULK_BYTES


def node_url(host: str, port: int) -> str:
    """``redis://host:port``, an IPv6 address in brackets (``parse_addresses`` strips them)."""
    return f"redis://[{host}]:{port}" if ":" in host else f"redis://{host}:{port}"


def close(client: Client) -> None:
    """Close ``client`` and every socket it opened: a single node's pool and a cluster's
    node pools too, which ``redis.Redis(connection_pool=...)`` leaves open until they are
    garbage collected."""
    pools = (
        [client.connection_pool]
        if isinstance(client, redis.Redis)
        else [n.redis_connection.connection_pool for n in client.get_nodes() if n.redis_connection]
    )  # a cluster's node clients are built on pools of their own too (the url path)
    client.close()
    for pool in pools:
        pool.disconnect()
