"""The Redis L2 when Redis loses data, freezes or refuses a command: the format record
outlives a flush, a frozen cluster master is waited on once per call, error messages carry
no row bytes, and a row longer than the server's proto-max-bulk-len is refused up front."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from redis.connection import AbstractConnection
from redis.exceptions import TimeoutError as RedisTimeoutError

from hps.config import VolatileDBConfig
from hps.errors import BackendError, BackendUnavailable, CircuitOpenError, ConfigError, RequestError
from hps.rowformat import FORMATS
from hps.storage import open_store
from hps.storage.redis_cluster import RedisStore
from hps.storage.redis_layout import meta_name
from hps.testing.redis import RedisClusterServers, RedisServer
from hps.types import TableSpec
from tests.helpers import rows, unique_name

pytestmark = pytest.mark.integration


def make_store(address: str, **cfg: Any) -> RedisStore:
    store = open_store(VolatileDBConfig(type="redis_cluster", address=address, **cfg))
    assert isinstance(store, RedisStore)
    return store


@pytest.fixture(params=["single", "cluster"])
def address(request: pytest.FixtureRequest) -> str:
    name = "redis_address" if request.param == "single" else "redis_cluster_address"
    return str(request.getfixturevalue(name))


def flush_all(address: str) -> None:
    """What a restart of a Redis without persistence, or a failover to an empty node, does."""
    for node in address.split(","):
        with contextlib.closing(redis.Redis.from_url(f"redis://{node}")) as c:
            c.flushall()


# -- the format record --------------------------------------------------------------------


@pytest.mark.parametrize("write", ["insert", "insert_absent"])
def test_a_writer_restores_the_record_redis_lost(address: str, write: str) -> None:
    """A long-running writer keeps writing after Redis lost everything: its rows come back
    with their record, and a process that opens the table later takes them as they are."""
    spec = TableSpec(model=unique_name(), table="t", dim=16, row_dtype="float16")
    fmt = FORMATS["float16"]
    writer = make_store(address, num_partitions=4)
    writer.open_table(spec)
    keys = np.arange(100, dtype=np.int64)
    getattr(writer, write)(spec.name, keys, fmt.encode(rows(keys, 16)))
    flush_all(address)
    getattr(writer, write)(spec.name, keys, fmt.encode(rows(keys, 16, seed=1)))
    record = writer.client.get(meta_name(spec.name))
    assert record is not None
    later = make_store(address, num_partitions=4)
    later.open_table(spec)  # not refused as float32 rows of dimension 8
    values, found = later.fetch(spec.name, keys)
    assert found.all()
    np.testing.assert_array_equal(values, fmt.encode(rows(keys, 16, seed=1)))
    writer.close()
    later.close()


def test_insert_max_restores_the_record_too(redis_address: str) -> None:
    spec = TableSpec(model=unique_name(), table="t", dim=4)
    writer = make_store(redis_address, num_partitions=2)
    writer.open_table(spec)
    keys = np.arange(10, dtype=np.int64)
    flush_all(redis_address)
    writer.insert_max(spec.name, keys, rows(keys, 4))
    assert writer.client.get(meta_name(spec.name)) == b'{"row_dtype": "float32", "dim": 4}'
    writer.close()


def test_rows_without_their_record_are_refused_with_a_flush_not_a_reimport(
    redis_address: str,
) -> None:
    """Rows whose record is gone (written by a client that does not restore it) are read
    as the float32 rows of the days before records; where that does not fit, the error says
    so and advises emptying the L2, not `hps import --force` (which drops L3 too)."""
    spec = TableSpec(model=unique_name(), table="t", dim=16, row_dtype="float16")
    store = make_store(redis_address, num_partitions=2)
    store.open_table(spec)
    keys = np.arange(10, dtype=np.int64)
    store.insert(spec.name, keys, FORMATS["float16"].encode(rows(keys, 16)))
    store.client.delete(meta_name(spec.name))
    again = make_store(redis_address, num_partitions=2)
    with pytest.raises(ConfigError) as info:
        again.open_table(spec)
    message = str(info.value)
    assert "no record of their format" in message
    assert "inferred from the rows" in message
    assert "float32 rows of dimension 8" in message
    assert "FLUSHDB" in message
    assert "re-import it with" not in message
    store.close()
    again.close()


# -- a frozen cluster master --------------------------------------------------------------


@pytest.fixture
def socket_timeouts(monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    """Socket timeouts redis-py's connections actually waited out, per server port (a
    connect or a read that raised TimeoutError from the socket, below HPS's connection)."""
    counts: dict[int, int] = {}
    read, connect = AbstractConnection.read_response, AbstractConnection.connect_check_health

    def counted(method: Any) -> Any:
        def wrapper(self: AbstractConnection, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except RedisTimeoutError:
                port = int(getattr(self, "port", 0))
                counts[port] = counts.get(port, 0) + 1
                raise

        return wrapper

    monkeypatch.setattr(AbstractConnection, "read_response", counted(read))
    monkeypatch.setattr(AbstractConnection, "connect_check_health", counted(connect))
    return counts


@contextlib.contextmanager
def frozen(pid: int | None) -> Iterator[None]:
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("call", ["fetch", "insert", "size", "remove"])
def test_a_frozen_cluster_master_is_waited_on_once_per_call(
    redis_cluster_address: str,
    redis_cluster: RedisClusterServers,
    socket_timeouts: dict[int, int],
    call: str,
) -> None:
    """redis-py re-sends the commands of a pipeline that timed out one at a time, each
    after re-reading the layout; each would wait out the socket timeout on the frozen node
    again. One call waits on it once."""
    store = make_store(redis_cluster_address, num_partitions=16, hps_socket_timeout_s=0.5)
    spec = TableSpec(model=unique_name(), table="t", dim=8)
    store.open_table(spec)
    keys = np.arange(2000, dtype=np.int64)
    store.insert(spec.name, keys, rows(keys, 8))
    victim = redis_cluster.nodes[1]
    calls = {
        "fetch": lambda: store.fetch(spec.name, keys),
        "insert": lambda: store.insert(spec.name, keys, rows(keys, 8)),
        "size": lambda: store.size(spec.name),
        "remove": lambda: store.remove(spec.name, keys),
    }
    with frozen(victim.pid), pytest.raises(BackendUnavailable):
        calls[call]()
    assert socket_timeouts == {victim.port: 1}
    redis_cluster.start()  # waits for cluster_state:ok on every node
    time.sleep(store.breaker.stats().backoff_s)  # the breaker's back-off, then a probe
    assert store.size(spec.name) >= 0
    store.close()


def test_a_frozen_single_node_is_waited_on_once_per_call(
    redis_address: str, redis_server: RedisServer, socket_timeouts: dict[int, int]
) -> None:
    store = make_store(redis_address, hps_socket_timeout_s=0.5)
    spec = TableSpec(model=unique_name(), table="t", dim=8)
    store.open_table(spec)
    keys = np.arange(100, dtype=np.int64)
    with frozen(redis_server.node.pid), pytest.raises(BackendUnavailable):
        store.insert(spec.name, keys, rows(keys, 8))
    assert socket_timeouts == {redis_server.node.port: 1}
    store.close()


# -- errors Redis answers ------------------------------------------------------------------


@contextlib.contextmanager
def full(server: RedisServer) -> Iterator[None]:
    """Redis above its maxmemory, evicting nothing: every write is refused (OOM)."""
    with contextlib.closing(server.node.client()) as c:
        c.config_set("maxmemory-policy", "noeviction")
        c.config_set("maxmemory", 1)
        try:
            yield
        finally:
            c.config_set("maxmemory", 0)


@pytest.mark.parametrize("write", ["insert", "insert_absent"])
def test_a_refused_write_names_redis_text_and_the_command_only(
    redis_address: str, redis_server: RedisServer, write: str
) -> None:
    store = make_store(redis_address, num_partitions=4)
    spec = TableSpec(model=unique_name(), table="t", dim=4)
    store.open_table(spec)
    keys = np.array([10, 13, 0, 2**40 + 0x0A0D], dtype=np.int64)  # bytes \n, \r and NULs
    with full(redis_server), pytest.raises(BackendError) as info:
        getattr(store, write)(spec.name, keys, rows(keys, 4))
    message = str(info.value)
    assert "maxmemory" in message and "OutOfMemoryError" in message
    assert message.endswith(("(HSET)", "(SET)", "(EVAL)")), message
    assert "\x00" not in message and "\n" not in message and "\r" not in message
    assert "hps_et" not in message and "redis.call" not in message  # no arguments, no Lua
    assert message.isprintable()
    store.close()


# -- a row longer than proto-max-bulk-len -------------------------------------------------


@pytest.fixture(scope="module")
def small_bulk_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(
        Path(tmp_path_factory.mktemp("redis-bulk")), extra_args=["--proto-max-bulk-len", "1mb"]
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_a_row_longer_than_the_servers_bulk_limit_is_refused_up_front(
    small_bulk_redis: RedisServer,
) -> None:
    """Redis drops the connection of a command with a longer argument ("Broken pipe"):
    unavailable, the breaker tripped, and `hps consume` retrying that batch for ever."""
    store = make_store(small_bulk_redis.address, num_partitions=2)
    wide = TableSpec(model=unique_name(), table="t", dim=300_000)  # 1.2 MB a row
    store.open_table(wide)
    keys = np.arange(2, dtype=np.int64)
    for write in (store.insert, store.insert_absent, store.insert_max):
        with pytest.raises(RequestError, match=r"proto-max-bulk-len \(1048576 bytes\)"):
            write(wide.name, keys, np.ones((2, 300_000), np.float32))
    assert store.size(wide.name) == 0
    stats = store.breaker.stats()
    assert stats.state == "closed" and stats.trips == 0
    narrow = TableSpec(model=unique_name(), table="t", dim=200_000)  # 0.8 MB: accepted
    store.open_table(narrow)
    store.insert(narrow.name, keys, np.ones((2, 200_000), np.float32))
    assert store.fetch(narrow.name, keys)[1].all()
    store.close()


def test_dump_is_behind_the_breaker(redis_address: str) -> None:
    store = make_store(redis_address, hps_breaker_backoff_s=60.0, hps_breaker_max_backoff_s=60.0)
    spec = TableSpec(model=unique_name(), table="t", dim=4)
    store.open_table(spec)
    store.insert(spec.name, np.arange(5, dtype=np.int64), rows(np.arange(5), 4))
    with contextlib.suppress(BackendUnavailable), store.breaker.guard("test"):
        raise BackendUnavailable("down")  # the breaker opens
    with pytest.raises(CircuitOpenError):
        list(store.dump(spec.name))
    store.close()


def test_a_dump_of_a_stopped_redis_trips_the_breaker(
    redis_address: str, redis_server: RedisServer
) -> None:
    store = make_store(redis_address, num_partitions=2)
    spec = TableSpec(model=unique_name(), table="t", dim=4)
    store.open_table(spec)
    store.insert(spec.name, np.arange(100, dtype=np.int64), rows(np.arange(100), 4))
    pages = store.dump(spec.name)  # a page per partition: the second is read after the stop
    next(pages)
    redis_server.stop()
    try:
        with pytest.raises(BackendUnavailable):
            list(pages)
        assert store.breaker.stats().trips == 1
    finally:
        redis_server.start()
    store.close()
