"""The Redis backend's pure parts: key layout, partitioning, address parsing, error mapping."""

from __future__ import annotations

from urllib.parse import urlsplit

import numpy as np
import pytest
from redis import exceptions as rx

from hps.errors import BackendError, BackendUnavailable, ConfigError
from hps.storage.keybytes import key_bytes
from hps.storage.redis_conn import node_url, parse_addresses, translated
from hps.storage.redis_layout import (
    group_by_partition,
    hash_name,
    partition_of,
    stamp_name,
)


def test_key_bytes_are_8_byte_little_endian_with_zero_bytes_kept() -> None:
    keys = np.array([0, 1, -1, 256, 2**40], dtype=np.int64)
    fields = key_bytes(keys)
    assert fields == [int(k).to_bytes(8, "little", signed=True) for k in keys.tolist()]


def test_partition_names_share_a_hash_tag_per_partition() -> None:
    assert hash_name("m.t", 3) == b"hps_et{m.t/p3}"
    assert stamp_name("m.t", 3) == b"hps_ts{m.t/p3}"


def test_partitions_are_deterministic_and_spread() -> None:
    keys = np.arange(100_000, dtype=np.int64)
    part = partition_of(keys, 16)
    np.testing.assert_array_equal(part, partition_of(keys.copy(), 16))
    counts = np.bincount(part, minlength=16)
    assert part.min() >= 0 and part.max() < 16
    assert counts.min() > 0.9 * keys.size / 16 and counts.max() < 1.1 * keys.size / 16
    assert (partition_of(np.array([-1, -(2**63)], dtype=np.int64), 7) < 7).all()


@pytest.mark.parametrize("partitions", [1, 5, 64])
def test_group_by_partition_covers_each_key_once(partitions: int) -> None:
    keys = np.random.default_rng(0).integers(-(2**62), 2**62, 1000)
    order, groups = group_by_partition(keys, partitions)
    assert sorted(order.tolist()) == list(range(keys.size))
    part = partition_of(keys, partitions)
    covered = 0
    for p, lo, hi in groups:
        assert hi > lo and (part[order[lo:hi]] == p).all()
        covered += hi - lo
    assert covered == keys.size
    assert group_by_partition(np.empty(0, np.int64), partitions)[1] == []


def test_parse_addresses() -> None:
    assert parse_addresses("127.0.0.1:7000, h2:7001,") == [("127.0.0.1", 7000), ("h2", 7001)]
    assert parse_addresses("redis") == [("redis", 6379)]
    for bad in ("", "h:0", "h:x", ":7000", "h:70000"):
        with pytest.raises(ConfigError, match="address"):
            parse_addresses(bad)
    for url in ("redis://default:s3cretpw@127.0.0.1:6379", "u:s3cretpw@h"):
        with pytest.raises(ConfigError, match="not a URL") as err:
            parse_addresses(url)
        assert "s3cretpw" not in str(err.value)


@pytest.mark.parametrize(
    ("exc", "expected", "is_retriable"),
    [
        (rx.ConnectionError("refused"), BackendUnavailable, True),
        (rx.TimeoutError("slow"), BackendUnavailable, True),
        (rx.ClusterDownError("CLUSTERDOWN"), BackendUnavailable, True),
        (rx.AuthenticationError("bad password"), BackendError, False),
        (rx.ResponseError("WRONGTYPE"), BackendError, False),
    ],
)
def test_driver_errors_are_translated(exc: Exception, expected: type, is_retriable: bool) -> None:
    with pytest.raises(expected) as info, translated("fetch m.t"):
        raise exc
    assert type(info.value) is expected
    assert isinstance(info.value, BackendUnavailable) is is_retriable
    assert "fetch m.t" in str(info.value)


def test_a_node_url_brackets_an_ipv6_address() -> None:
    """A TLS cluster is reached through a URL: an IPv6 node's address needs its brackets
    back (redis-py read ``redis://::1:6379``'s port as ``:1:6379``)."""
    (host, port), (host6, port6) = parse_addresses("127.0.0.1:7000,[::1]:7001")
    assert node_url(host, port) == "redis://127.0.0.1:7000"
    assert node_url(host6, port6) == "redis://[::1]:7001"
    url = urlsplit(node_url(host6, port6))
    assert (url.hostname, url.port) == ("::1", 7001)
