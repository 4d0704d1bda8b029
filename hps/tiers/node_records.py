"""A Redis L2's hash of per-node documents: the serving nodes' version records
(:mod:`hps.updates.shared_record`), one field per node (docs/redis.md, "Layout")."""

from __future__ import annotations

from typing import cast

from hps.config import VolatileDBConfig
from hps.storage.redis_conn import Client, connect, translated
from hps.storage.redis_layout import NODE_RECORDS


class NodeRecords:
    """The hash, through one client made at first use; redis-py's errors come out as
    :class:`hps.errors.BackendError` (:class:`~hps.errors.BackendUnavailable`: unreachable)."""

    def __init__(self, cfg: VolatileDBConfig) -> None:
        self.cfg = cfg
        self._client: Client | None = None

    def _redis(self) -> Client:
        if self._client is None:
            self._client, _ = connect(self.cfg)
        return self._client

    def put(self, node: str, document: str) -> None:
        with translated("publishing a version record"):
            self._redis().hset(NODE_RECORDS, node, document)

    def get(self, node: str) -> bytes | None:
        with translated("reading a version record"):
            return cast(bytes | None, self._redis().hget(NODE_RECORDS, node))

    def all(self) -> dict[bytes, bytes]:
        with translated("reading the nodes' version records"):
            return cast(dict[bytes, bytes], self._redis().hgetall(NODE_RECORDS))

    def forget(self, nodes: list[bytes]) -> None:
        if nodes:
            with translated("forgetting old version records"):
                self._redis().hdel(NODE_RECORDS, *nodes)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
