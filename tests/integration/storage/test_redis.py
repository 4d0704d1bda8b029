"""The Redis L2 against real servers: a single node and a 3-master Redis Cluster."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from hps.config import VolatileDBConfig
from hps.errors import BackendError, BackendUnavailable, ConfigError, UnknownTableError
from hps.net import free_port
from hps.storage import open_store
from hps.storage.redis_cluster import RedisStore
from hps.storage.redis_layout import hash_name, meta_name, partition_of
from hps.testing.redis import RedisClusterServers, RedisServer
from hps.types import TableSpec
from tests.helpers import rows, unique_name

pytestmark = pytest.mark.integration


SLOW_TIMEOUT_S = 60.0


def make_store(address: str, **cfg: Any) -> RedisStore:
    store = open_store(VolatileDBConfig(type="redis_cluster", address=address, **cfg))
    assert isinstance(store, RedisStore)
    return store


def new_table(store: RedisStore, dim: int = 8) -> TableSpec:
    spec = TableSpec(model=unique_name(), table="t", dim=dim)
    store.open_table(spec)
    return spec


@pytest.fixture(params=["single", "cluster"])
def address(request: pytest.FixtureRequest) -> str:
    name = "redis_address" if request.param == "single" else "redis_cluster_address"
    return str(request.getfixturevalue(name))


def test_round_trip_chunked_over_partitions(address: str) -> None:
    store = make_store(address, num_partitions=8, max_batch_size=100)
    spec = new_table(store)
    keys = np.random.default_rng(1).permutation(np.arange(-500, 1500, dtype=np.int64))
    store.insert(spec.name, keys, rows(keys, spec.dim))
    query = np.concatenate([keys[::-1], np.arange(5000, 5100, dtype=np.int64)])
    values, found = store.fetch(spec.name, query)
    assert found.tolist() == [True] * keys.size + [False] * 100
    assert values.flags.writeable and values.dtype == np.float32
    np.testing.assert_array_equal(values[: keys.size], rows(keys[::-1], spec.dim))
    assert store.size(spec.name) == keys.size
    store.remove(spec.name, keys[:1234])
    assert store.size(spec.name) == keys.size - 1234
    assert store.cluster is (address.count(",") > 0)
    store.close()


def test_layout_is_the_documented_one(redis_address: str) -> None:
    store = make_store(redis_address, num_partitions=4)
    spec = new_table(store, dim=3)
    keys = np.array([7, -2], dtype=np.int64)
    vals = rows(keys, 3)
    store.insert(spec.name, keys, vals)
    raw = redis.Redis.from_url(f"redis://{redis_address}")
    for key, row, p in zip(keys.tolist(), vals, partition_of(keys, 4).tolist(), strict=True):
        field = int(key).to_bytes(8, "little", signed=True)
        assert raw.hget(f"hps_et{{{spec.name}/p{p}}}", field) == row.tobytes()
    assert raw.keys("hps_ts*") == []  # no capacity limit: no bookkeeping
    raw.close()


def test_partitions_spread_over_the_cluster_nodes(
    redis_cluster_address: str, redis_cluster: RedisClusterServers
) -> None:
    store = make_store(redis_cluster_address, num_partitions=16)
    spec = new_table(store)
    keys = np.arange(3000, dtype=np.int64)
    store.insert(spec.name, keys, rows(keys, spec.dim))
    per_node = []
    for node in redis_cluster.nodes:
        with contextlib.closing(node.client()) as c:
            names = c.keys("hps_et*")
            per_node.append(len(names))
            assert sum(c.hlen(n) for n in names) > 0
    assert all(n > 0 for n in per_node), per_node
    assert sum(per_node) == 16
    assert store.size(spec.name) == keys.size


def test_existing_rows_of_another_dimension_are_refused(address: str) -> None:
    store = make_store(address, num_partitions=2)
    spec = new_table(store, dim=4)
    store.insert(spec.name, np.arange(10), rows(np.arange(10), 4))
    with pytest.raises(ConfigError, match="holds float32 rows of dimension 4.*--force"):
        store.open_table(TableSpec(model=spec.model, table=spec.table, dim=6))


def test_a_stopped_redis_is_unavailable_quickly_then_back(address: str, request: Any) -> None:
    server = request.getfixturevalue("redis_server" if "," not in address else "redis_cluster")
    # A socket timeout far above what a refused connection takes: waiting it out is a bug.
    store = make_store(address, num_partitions=4, hps_socket_timeout_s=SLOW_TIMEOUT_S)
    spec = new_table(store)
    keys = np.arange(100, dtype=np.int64)
    store.insert(spec.name, keys, rows(keys, spec.dim))
    server.stop()
    try:
        for call in (
            lambda: store.fetch(spec.name, keys),
            lambda: store.insert(spec.name, keys, rows(keys, spec.dim)),
            lambda: make_store(address, hps_socket_timeout_s=SLOW_TIMEOUT_S),
        ):
            start = time.monotonic()
            with pytest.raises(BackendUnavailable) as info:
                call()
            took = time.monotonic() - start
            # Hang guard: a refused connection fails at once (0-4 ms measured); waiting out
            # the socket timeout would take 5x this bound.
            assert took < SLOW_TIMEOUT_S / 5, f"{took:.2f}s"
            assert isinstance(info.value, BackendUnavailable)
    finally:
        server.start()
    time.sleep(store.breaker.stats().backoff_s)  # the circuit breaker's back-off, then a probe
    store.insert(spec.name, keys, rows(keys, spec.dim))  # reconnects on its own
    values, found = store.fetch(spec.name, keys)
    assert found.all()
    np.testing.assert_array_equal(values, rows(keys, spec.dim))


def test_data_survives_a_reconnect(address: str, request: Any) -> None:
    server = request.getfixturevalue("redis_server" if "," not in address else "redis_cluster")
    nodes = server.nodes if hasattr(server, "nodes") else [server.node]
    store = make_store(address, num_partitions=8)
    spec = new_table(store)
    keys = np.arange(1000, dtype=np.int64)
    store.insert(spec.name, keys, rows(keys, spec.dim))
    killed = 0
    for node in nodes:
        with contextlib.closing(node.client()) as c:
            killed += c.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    assert killed > 0
    values, found = store.fetch(spec.name, keys)
    assert found.all()
    np.testing.assert_array_equal(values, rows(keys, spec.dim))


def test_a_hung_redis_times_out(redis_address: str, redis_server: RedisServer) -> None:
    store = make_store(redis_address, hps_socket_timeout_s=0.5)
    spec = new_table(store)
    assert redis_server.node.pid is not None
    os.kill(redis_server.node.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(BackendUnavailable, match="Timeout|timed out"):
            store.fetch(spec.name, np.arange(10))
        took = time.monotonic() - start
        # Hang guard: one 0.5 s socket timeout (0.50 s measured), 10x that as the bound.
        assert took < 5.0, f"{took:.2f}s"
    finally:
        os.kill(redis_server.node.pid, signal.SIGCONT)
    time.sleep(store.breaker.stats().backoff_s)  # the circuit breaker's back-off, then a probe
    assert store.fetch(spec.name, np.arange(10))[1].sum() == 0


def test_a_call_slower_than_the_timeout_over_its_chunks_is_unavailable(
    redis_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read has the socket timeout; a server answering every chunk just in time must
    not hold one call for as many timeouts as it has chunks."""
    store = make_store(redis_address, hps_socket_timeout_s=0.3, max_batch_size=10)
    spec = new_table(store)
    keys = np.arange(100)
    store.insert(spec.name, keys, rows(keys, 8))
    pipeline = store._r.pipeline

    def slow(*args: Any, **kwargs: Any) -> Any:  # 0.1 s a chunk: 10 chunks, 1 s in all
        pipe = pipeline(*args, **kwargs)
        execute = pipe.execute
        pipe.execute = lambda *a, **k: (time.sleep(0.1), execute(*a, **k))[1]
        return pipe

    monkeypatch.setattr(store._r, "pipeline", slow)
    with pytest.raises(BackendUnavailable, match=r"longer than 0.75 s .* over its chunks"):
        store.fetch(spec.name, keys)  # 10 chunks may take 10 / 4 timeouts, not 10
    monkeypatch.undo()
    time.sleep(store.breaker.stats().backoff_s)  # the breaker's back-off, then a probe
    assert store.fetch(spec.name, keys)[1].all()


def test_a_call_of_many_chunks_may_take_a_timeout_per_four(
    redis_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 chunks answered in 0.06 s each (1.2 s in all) from a healthy server, with a 1 s
    timeout: the call's budget is 5 s (a timeout per 4 chunks), so it is answered whole
    (a refresh slice of millions of keys from an idle Redis opened the breaker)."""
    store = make_store(redis_address, hps_socket_timeout_s=1.0, max_batch_size=10)
    spec = new_table(store)
    keys = np.arange(200)
    store.insert(spec.name, keys, rows(keys, 8))
    pipeline = store._r.pipeline

    def slow(*args: Any, **kwargs: Any) -> Any:
        pipe = pipeline(*args, **kwargs)
        execute = pipe.execute
        pipe.execute = lambda *a, **k: (time.sleep(0.06), execute(*a, **k))[1]
        return pipe

    monkeypatch.setattr(store._r, "pipeline", slow)
    assert store.fetch(spec.name, keys)[1].all()
    assert store.breaker.state == "closed"


def test_an_unknown_table_is_no_answer_of_redis(redis_address: str) -> None:
    """Asking the size of a table not open sends nothing: not a probe that could close the
    breaker, and an UnknownTableError even while the breaker is open."""
    store = make_store(redis_address, hps_breaker_backoff_s=60.0, hps_breaker_max_backoff_s=60.0)
    with contextlib.suppress(BackendUnavailable), store.breaker.guard("test"):
        raise BackendUnavailable("down")  # the breaker opens
    assert store.breaker.state == "open"
    with pytest.raises(UnknownTableError):
        store.size("nope.t")
    assert store.breaker.state == "open"
    store.close()


def test_close_closes_every_socket(address: str) -> None:
    client = redis.Redis.from_url(f"redis://{address.split(',')[0]}")
    last = max(int(c["id"]) for c in client.client_list())  # ids only grow
    stores = []
    for _ in range(5):
        store = make_store(address)
        store.size(new_table(store).name)
        store.close()
        stores.append(store)  # still referenced: only close() can have closed them
    # connections opened since (an earlier test's closing meanwhile does not count)
    assert [c for c in client.client_list() if int(c["id"]) > last] == []
    client.close()


def test_a_table_record_it_cannot_read_is_a_backend_error(redis_address: str) -> None:
    store = make_store(redis_address)
    spec = TableSpec(model=unique_name(), table="t", dim=8)
    store._r.execute_command("SET", meta_name(spec.name), b'{"row_dtype": "bfloat8"}')
    with pytest.raises(BackendError, match="record of table .* cannot be read: KeyError"):
        store.open_table(spec)


def test_several_addresses_of_a_single_node_are_refused(redis_address: str) -> None:
    with pytest.raises(ConfigError, match="not in cluster mode"):
        make_store(f"{redis_address},127.0.0.1:{free_port()}")


def test_any_reachable_cluster_node_is_enough(redis_cluster_address: str) -> None:
    dead = f"127.0.0.1:{free_port()}"
    store = make_store(f"{dead},{redis_cluster_address.split(',')[1]}")
    assert store.cluster
    spec = new_table(store)
    store.insert(spec.name, np.arange(50), rows(np.arange(50), spec.dim))
    assert store.size(spec.name) == 50


# -- authentication -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    acl = ["--user", "alice", "on", ">alice-pw", "~*", "&*", "+@all", "--requirepass", "secret"]
    server = RedisServer(Path(tmp_path_factory.mktemp("redis-auth")), extra_args=acl)
    server.node.password = "secret"
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize(("user", "password"), [("default", "secret"), ("alice", "alice-pw")])
def test_password_and_acl_user(secured: RedisServer, user: str, password: str) -> None:
    store = make_store(secured.address, user_name=user, password=password)
    spec = new_table(store)
    store.insert(spec.name, np.arange(20), rows(np.arange(20), spec.dim))
    assert store.fetch(spec.name, np.arange(20))[1].all()


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("default", "")])
def test_bad_credentials_are_not_retriable(secured: RedisServer, user: str, password: str) -> None:
    with pytest.raises(BackendError) as info:
        make_store(secured.address, user_name=user, password=password)
    assert not isinstance(info.value, BackendUnavailable)
    assert "Redis" in str(info.value)


@pytest.mark.parametrize("change", ["password rotated", "permission taken away"])
def test_lookups_read_l3_when_redis_refuses_the_client(tmp_path: Path, change: str) -> None:
    """Redis answers but refuses the client (its ACL user's password rotated, or its read
    permission taken away): L3 holds every row, so lookups are answered from it, and the
    refusal is an AccessRefused, not an outage."""
    from hps.errors import AccessRefused
    from hps.storage.rocks_db import RocksDBStore
    from hps.tiers import Tiers

    acl = ["--user", "bob", "on", ">bob-pw", "~*", "&*", "+@all", "--requirepass", "secret"]
    server = RedisServer(tmp_path / "redis", extra_args=acl)
    server.node.password = "secret"
    server.start()
    tiers = None
    try:
        store = make_store(server.address, user_name="bob", password="bob-pw")
        l3 = RocksDBStore(str(tmp_path / "l3"))
        tiers = Tiers(store, l3)
        spec = TableSpec(model=unique_name(), table="t", dim=4)
        tiers.open_tables([spec])
        keys = np.arange(10, dtype=np.int64)
        tiers.write(spec.name, keys, rows(keys, 4))
        admin = redis.Redis(host="127.0.0.1", port=server.node.port, password="secret")
        if change == "password rotated":
            admin.execute_command("ACL", "SETUSER", "bob", "resetpass", ">rotated")
            admin.execute_command("CLIENT", "KILL", "USER", "bob")
        else:
            admin.execute_command("ACL", "SETUSER", "bob", "-@read")
        admin.close()
        with pytest.raises(AccessRefused):
            store.fetch(spec.name, keys)
        got = tiers.fetch(spec, keys)
        np.testing.assert_array_equal(got.values, rows(keys, 4))
        assert got.found.all() and tiers.l2_read_errors == 1
    finally:
        if tiers is not None:
            tiers.close()
        server.stop()


def test_hash_name_matches_what_the_store_writes(redis_address: str) -> None:
    store = make_store(redis_address, num_partitions=1)
    spec = new_table(store, dim=2)
    store.insert(spec.name, np.array([5]), np.ones((1, 2), np.float32))
    raw = redis.Redis.from_url(f"redis://{redis_address}")
    assert raw.hlen(hash_name(spec.name, 0)) == 1
    raw.close()


def test_dump_yields_every_row(address: str) -> None:
    store = make_store(address, num_partitions=4)
    spec = new_table(store, dim=3)
    keys = np.arange(-300, 700, dtype=np.int64)
    store.insert(spec.name, keys, rows(keys, 3))
    chunks = list(store.dump(spec.name, chunk_rows=100))
    got_keys = np.concatenate([k for k, _ in chunks])
    got_vals = np.concatenate([v for _, v in chunks])
    order = np.argsort(got_keys)
    np.testing.assert_array_equal(got_keys[order], keys)
    np.testing.assert_array_equal(got_vals[order], rows(keys, 3))


def test_rows_from_before_formats_are_float32(address: str) -> None:
    """Rows written before the format was recorded (no ``hps_tm`` key) are float32."""
    store = make_store(address, num_partitions=2)
    spec = new_table(store, dim=4)
    store.insert(spec.name, np.arange(10), rows(np.arange(10), 4))
    store.client.delete(meta_name(spec.name))  # as an older HPS left it
    again = make_store(address, num_partitions=2)
    with pytest.raises(ConfigError, match="no record of their format.* inferred from the rows"
                       ".* float32 rows of dimension 4.* FLUSHDB"):  # fmt: skip
        again.open_table(TableSpec(model=spec.model, table=spec.table, dim=4, row_dtype="int8"))
    again.open_table(spec)  # accepted, and recorded
    assert json.loads(store.client.get(meta_name(spec.name))) == {"row_dtype": "float32", "dim": 4}
    store.close()
    again.close()


def test_the_stored_format_is_read_without_writing(address: str) -> None:
    """What an import's first record of version 1 checks (hps.versions.held): the
    recorded format, else the width of rows from before records, else none; nothing is
    recorded by asking."""
    from hps.rowformat import FORMATS

    store = make_store(address, num_partitions=2)
    spec = TableSpec(model=unique_name(), table="t", dim=4, row_dtype="float16")
    assert store.stored_format(spec) is None
    assert store.client.get(meta_name(spec.name)) is None
    store.open_table(spec)
    other = TableSpec(model=spec.model, table="t", dim=8)
    assert store.stored_format(other) == (FORMATS["float16"], 4)
    old = new_table(store, dim=4)
    store.insert(old.name, np.arange(10), rows(np.arange(10), 4))
    store.client.delete(meta_name(old.name))  # as an older HPS left it
    assert store.stored_format(TableSpec(model=old.model, table="t", dim=6, row_dtype="int8")) == (
        FORMATS["float32"],
        4,
    )
    assert store.client.get(meta_name(old.name)) is None
    store.close()


def test_a_first_versioned_import_checks_a_redis_l2(redis_address: str, tmp_path: Path) -> None:
    """A node without L3: version 1's entry is checked against the Redis L2's records."""
    from hps.config import parse_config
    from hps.versions.held import check_held

    store = make_store(redis_address)
    spec = new_table(store, dim=4)  # version 1 of model spec.model, float32
    doc = {
        "models": [{"model": spec.model, "embedding_table_names": ["t"],
                    "embedding_vecsize_per_table": [4], "hps_row_dtype": "float16"}],
        "volatile_db": {"type": "redis_cluster", "address": redis_address},
        "persistent_db": {"type": "disabled"},
    }  # fmt: skip
    config = parse_config(doc, str(tmp_path / "ps.json"))
    with pytest.raises(ConfigError, match=r"table t is held in L2 \(redis_cluster\) as float32 "
                       "rows of dimension 4 but configured as float16"):  # fmt: skip
        check_held(config, config.model(spec.model))
    doc["models"][0]["hps_row_dtype"] = "float32"  # as it was imported
    restored = parse_config(doc, str(tmp_path / "ps.json"))
    check_held(restored, restored.model(spec.model))
    store.close()


# -- a table dropped and created again by another process -----------------------------------

F16_AGAIN_AS_I8 = (
    "float16 rows of dimension 8, but Redis now records it as int8 rows of dimension 8"
)


def near_one(n: int, dim: int = 8) -> np.ndarray:
    """Vectors near 1 (what the audit served as inf and 1712 from a stale float16 handle)."""
    return 1 + np.linspace(0, 0.01, n * dim, dtype=np.float32).reshape(n, dim)


@pytest.mark.parametrize("policy", ["none", "evict_least_used"])
def test_a_handle_refuses_a_table_created_again_in_another_format(
    address: str, policy: str
) -> None:
    """float16 and int8 rows of dim 8 are both 16 bytes: a handle that opened the table as
    float16 before another process re-created it as int8 (``hps import --force``) must
    neither read the int8 rows as float16 nor write float16 rows among them."""
    cfg: dict[str, Any] = {"num_partitions": 4, "max_batch_size": 16}  # a fetch of chunks
    if policy != "none":  # a fetch then also stamps its keys (ZADD) in its pipelines
        cfg.update(overflow_margin=10_000, overflow_policy=policy)
    model = unique_name()
    f16 = TableSpec(model=model, table="t", dim=8, row_dtype="float16")
    i8 = TableSpec(model=model, table="t", dim=8, row_dtype="int8")
    keys = np.arange(1, 41, dtype=np.int64)
    vals = near_one(keys.size)
    stale, importer = make_store(address, **cfg), make_store(address, **cfg)
    stale.open_table(f16)
    stale.insert(f16.name, keys, f16.fmt.encode(vals))
    importer.drop_table(i8.name)  # hps import --force
    importer.open_table(i8)
    new_rows = i8.fmt.encode(vals * 2)
    importer.insert(i8.name, keys, new_rows)

    calls = {
        "fetch": lambda: stale.fetch(f16.name, keys),
        "insert": lambda: stale.insert(f16.name, keys[:5], f16.fmt.encode(vals[:5])),
        "insert_absent": lambda: stale.insert_absent(f16.name, keys + 100, f16.fmt.encode(vals)),
        "remove": lambda: stale.remove(f16.name, keys[:5]),
        "dump": lambda: list(stale.dump(f16.name)),
    }
    for name, call in calls.items():
        with pytest.raises(BackendError, match=F16_AGAIN_AS_I8) as info:
            call()
        assert not isinstance(info.value, BackendUnavailable), name
        assert f"table {f16.name}" in str(info.value) and "hps reload" in str(info.value)
    assert stale.breaker.stats().trips == 0 and stale.breaker.state == "closed"

    assert importer.size(i8.name) == keys.size  # nothing written, nothing removed
    fresh = make_store(address, **cfg)
    fresh.open_table(i8)
    for reader in (importer, fresh):
        got, found = reader.fetch(i8.name, np.concatenate([keys, keys + 100]))
        assert found.tolist() == [True] * keys.size + [False] * keys.size
        np.testing.assert_array_equal(got[: keys.size], new_rows)
    np.testing.assert_allclose(i8.fmt.decode(got[: keys.size], 8), vals * 2, rtol=0.01)
    for store in (stale, importer, fresh):
        store.close()


def test_a_handle_goes_on_when_the_table_comes_back_in_its_format(address: str) -> None:
    """A table dropped reads as empty (no record is no error); created again in the same
    format and dimension, a handle that opened it before reads and writes it as before."""
    spec = TableSpec(model=unique_name(), table="t", dim=8, row_dtype="float16")
    keys = np.arange(20, dtype=np.int64)
    vals = near_one(keys.size)
    old, other = make_store(address, num_partitions=4), make_store(address, num_partitions=4)
    old.open_table(spec)
    old.insert(spec.name, keys, spec.fmt.encode(vals))
    other.drop_table(spec.name)
    assert not old.fetch(spec.name, keys)[1].any()  # dropped, not created again: empty
    other.open_table(spec)
    other.insert(spec.name, keys[:10], spec.fmt.encode(vals[:10] * 3))
    got, found = old.fetch(spec.name, keys)
    assert found.tolist() == [True] * 10 + [False] * 10
    np.testing.assert_array_equal(got[:10], spec.fmt.encode(vals[:10] * 3))
    old.insert(spec.name, keys[10:], spec.fmt.encode(vals[10:]))
    np.testing.assert_array_equal(other.fetch(spec.name, keys)[0][10:], spec.fmt.encode(vals[10:]))
    old.close()
    other.close()


def test_a_reader_that_opened_a_table_before_its_writer_goes_on(address: str) -> None:
    """A reader that opened a table before any writer (and so recorded it) reads what a
    writer then imports in that format, also after the writer dropped it first."""
    spec = TableSpec(model=unique_name(), table="t", dim=4, row_dtype="int8")
    keys = np.arange(30, dtype=np.int64)
    reader, writer = make_store(address, num_partitions=2), make_store(address, num_partitions=2)
    reader.open_table(spec)
    assert not reader.fetch(spec.name, keys)[1].any()
    writer.drop_table(spec.name)  # an import with --force: the record the reader wrote goes
    writer.open_table(spec)
    encoded = spec.fmt.encode(rows(keys, 4))
    writer.insert(spec.name, keys, encoded)
    got, found = reader.fetch(spec.name, keys)
    assert found.all()
    np.testing.assert_array_equal(got, encoded)
    reader.close()
    writer.close()
