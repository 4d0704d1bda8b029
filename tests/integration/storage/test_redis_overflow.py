"""Capacity limits of the Redis L2: every overflow_policy evicts down to the target."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import redis

from hps.config import VolatileDBConfig
from hps.errors import BackendError
from hps.storage import open_store
from hps.storage.redis_cluster import RedisStore
from hps.storage.redis_layout import stamp_name
from hps.types import TableSpec
from tests.helpers import rows, unique_name

pytestmark = pytest.mark.integration

MARGIN = 100  # rows per partition
TARGET = 0.8  # evict down to 80 rows


@pytest.fixture(params=["single", "cluster"])
def address(request: pytest.FixtureRequest) -> str:
    name = "redis_address" if request.param == "single" else "redis_cluster_address"
    return str(request.getfixturevalue(name))


def limited(
    address: str, policy: str, partitions: int = 1, batch: int = 1000
) -> tuple[RedisStore, TableSpec]:
    cfg = VolatileDBConfig(
        type="redis",
        address=address,
        num_partitions=partitions,
        max_batch_size=batch,
        overflow_margin=MARGIN,
        overflow_policy=policy,  # type: ignore[arg-type]
        overflow_resolution_target=TARGET,
    )
    store = open_store(cfg)
    assert isinstance(store, RedisStore)
    spec = TableSpec(model=unique_name(), table="t", dim=4)
    store.open_table(spec)
    return store, spec


def put(store: RedisStore, spec: TableSpec, keys: np.ndarray) -> None:
    store.insert(spec.name, keys, rows(keys, spec.dim))


def present(store: RedisStore, spec: TableSpec, keys: np.ndarray) -> np.ndarray:
    values, found = store.fetch(spec.name, keys)
    np.testing.assert_array_equal(values[found], rows(keys[found], spec.dim))
    return found


A1, A2, B = np.arange(0, 40), np.arange(40, 80), np.arange(80, 120)


def test_evict_random_evicts_down_to_the_target(address: str) -> None:
    store, spec = limited(address, "evict_random")
    put(store, spec, np.arange(MARGIN))
    assert store.size(spec.name) == MARGIN  # at the margin: nothing evicted yet
    put(store, spec, np.arange(MARGIN, MARGIN + 30))
    assert store.size(spec.name) == int(MARGIN * TARGET)
    assert present(store, spec, np.arange(MARGIN + 30)).sum() == int(MARGIN * TARGET)


def test_evict_oldest_keeps_the_newest_rows(address: str) -> None:
    store, spec = limited(address, "evict_oldest")
    put(store, spec, A1)
    put(store, spec, A2)
    present(store, spec, A1)  # reads do not make a row younger
    put(store, spec, B)  # 120 rows > 100: the 40 oldest go
    assert store.size(spec.name) == 80
    assert not present(store, spec, A1).any()
    assert present(store, spec, A2).all() and present(store, spec, B).all()


def test_evict_least_used_keeps_the_recently_fetched_rows(address: str) -> None:
    store, spec = limited(address, "evict_least_used")
    put(store, spec, A1)
    put(store, spec, A2)
    assert present(store, spec, A1).all()  # A1 is now used more recently than A2
    put(store, spec, B)
    assert store.size(spec.name) == 80
    assert not present(store, spec, A2).any()
    assert present(store, spec, A1).all() and present(store, spec, B).all()


def test_a_redis_at_maxmemory_still_answers_evict_least_used_reads(redis_address: str) -> None:
    """The read's touch (a ZADD, a write) is refused at maxmemory: the reads it came with
    are answered all the same (before, every lookup failed, with no fall back to L3)."""
    store, spec = limited(redis_address, "evict_least_used")
    put(store, spec, A1)
    admin = redis.Redis.from_url(f"redis://{redis_address}")
    used = int(admin.info("memory")["used_memory"])
    # well below what Redis uses (noeviction: writes refused, reads answered): its use
    # moves by kilobytes between two looks (client buffers), so a bound just under it
    # may be above it again by the time the write comes
    admin.config_set("maxmemory", str(used // 2))
    try:
        with pytest.raises(BackendError, match="maxmemory|OOM|used memory"):
            put(store, spec, B)  # a write: refused, and said so
        assert present(store, spec, A1).all()
    finally:
        admin.config_set("maxmemory", "0")
        admin.close()


@pytest.mark.parametrize("policy", ["evict_random", "evict_least_used", "evict_oldest"])
def test_every_partition_stays_within_the_margin(address: str, policy: str) -> None:
    store, spec = limited(address, policy, partitions=4, batch=32)  # evicts per chunk
    keys = np.arange(2000, dtype=np.int64)
    for lo in range(0, keys.size, 250):
        put(store, spec, keys[lo : lo + 250])
    hashes = [f"hps_et{{{spec.name}/p{p}}}" for p in range(4)]
    raw = _raw(address)
    lengths = [raw.hlen(h) for h in hashes]
    raw.close()
    assert all(int(MARGIN * TARGET) <= n <= MARGIN for n in lengths), lengths
    assert store.size(spec.name) == sum(lengths)
    assert present(store, spec, keys).sum() == sum(lengths)


def test_one_insert_above_the_margin_is_cut_to_the_target(address: str) -> None:
    store, spec = limited(address, "evict_oldest")
    put(store, spec, np.arange(500))
    assert store.size(spec.name) == 80
    raw = _raw(address)
    assert raw.zcard(stamp_name(spec.name, 0)) == 80  # bookkeeping follows the evictions
    raw.close()


def test_removed_rows_leave_the_bookkeeping(address: str) -> None:
    store, spec = limited(address, "evict_least_used")
    put(store, spec, A1)
    store.remove(spec.name, A1[:10])
    raw = _raw(address)
    assert raw.zcard(stamp_name(spec.name, 0)) == 30
    raw.close()
    assert store.size(spec.name) == 30


def test_rows_without_timestamps_are_still_evicted(address: str) -> None:
    """Rows written while no margin was configured have no score: they count as oldest."""
    plain = open_store(VolatileDBConfig(type="redis", address=address, num_partitions=1))
    assert plain is not None
    store, spec = limited(address, "evict_oldest")
    plain.open_table(spec)
    plain.insert(spec.name, A1, rows(A1, spec.dim))
    plain.insert(spec.name, A2, rows(A2, spec.dim))
    put(store, spec, B)
    assert store.size(spec.name) == 80
    assert present(store, spec, B).all()


def _raw(address: str) -> Any:
    url = f"redis://{address.split(',')[0]}"
    return redis.RedisCluster.from_url(url) if "," in address else redis.Redis.from_url(url)
