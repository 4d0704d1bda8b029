"""A Redis L2's hash of per-node documents: the serving nodes' version records
(:mod:`hps.updates.shared_record`), one field per node (docs/redis.md, "Layout")."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

from hps.config import VolatileDBConfig
from hps.storage.redis_layout import NODE_RECORDS

if TYPE_CHECKING:
    from hps.storage.redis_conn import Client


class NodeRecords:
    """The hash, through one client made at first use; redis-py's errors come out as
    :class:`hps.errors.BackendError` (:class:`~hps.errors.BackendUnavailable`: unreachable)."""

    def __init__(self, cfg: VolatileDBConfig) -> None:
        self.cfg = cfg
        self._client: Client | None = None

    @contextmanager
    def _redis(self, what: str) -> Iterator[Client]:
        # imported here: redis-py is the Redis extra's, and every node imports this module
        from hps.storage.redis_conn import connect, translated

        with translated(what):
            if self._client is None:
                self._client, _ = connect(self.cfg)
            yield self._client

    def put(self, node: str, document: str) -> None:
        with self._redis("publishing a version record") as r:
            r.hset(NODE_RECORDS, node, document)

    def get(self, node: str) -> bytes | None:
        with self._redis("reading a version record") as r:
            return cast(bytes | None, r.hget(NODE_RECORDS, node))

    def all(self) -> dict[bytes, bytes]:
        with self._redis("reading the nodes' version records") as r:
            return cast(dict[bytes, bytes], r.hgetall(NODE_RECORDS))

    def forget(self, nodes: list[bytes]) -> None:
        if nodes:
            with self._redis("forgetting old version records") as r:
                r.hdel(NODE_RECORDS, *nodes)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
