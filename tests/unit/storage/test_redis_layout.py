"""The Redis backend's pure parts: key layout, partitioning, address parsing, error mapping."""

from __future__ import annotations

from urllib.parse import urlsplit

import numpy as np
import pytest
from redis import exceptions as rx

from hps.errors import AccessRefused, BackendError, BackendUnavailable, ConfigError
from hps.storage.keybytes import key_bytes
from hps.storage.redis_conn import (
    DEFAULT_MAX_BULK_BYTES,
    max_bulk_bytes,
    node_url,
    parse_addresses,
    translated,
)
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
        (rx.AuthenticationError("bad password"), AccessRefused, False),
        (rx.NoPermissionError("NOPERM no read"), AccessRefused, False),
        (rx.ResponseError("WRONGTYPE"), BackendError, False),
    ],
)
def test_driver_errors_are_translated(exc: Exception, expected: type, is_retriable: bool) -> None:
    with pytest.raises(expected) as info, translated("fetch m.t"):
        raise exc
    assert type(info.value) is expected
    assert isinstance(info.value, BackendUnavailable) is is_retriable
    assert "fetch m.t" in str(info.value)


def test_a_pipeline_error_keeps_redis_text_and_the_command_name_only() -> None:
    """redis-py puts the failed command and its arguments (row bytes: NULs, anything,
    even a crafted "of pipeline caused error") in front of Redis's text."""
    row = b"\x00\n\x01) of pipeline caused error: fake\x00".decode("latin-1")
    exc = rx.OutOfMemoryError(
        f"Command # 2 (HSET hps_et{{m.t/p11}} \x00\x00\x00 {row}) of pipeline caused "
        "error: command not allowed when used memory > 'maxmemory'."
    )
    with pytest.raises(BackendError) as info, translated("insert m.t"):
        raise exc
    assert str(info.value) == (
        "insert m.t: Redis error: OutOfMemoryError: command not allowed when used memory > "
        "'maxmemory'. (HSET)"
    )
    script = rx.ResponseError(
        "Command # 1 (EVAL for i = 1, #ARGV, 2 do redis.call('HSETNX', KEYS[1]) end 1 k) of "
        "pipeline caused error: ERR some\x00thing"
    )
    with pytest.raises(BackendError) as info, translated("insert m.t"):
        raise script
    assert str(info.value) == "insert m.t: Redis error: ERR some?thing (EVAL)"


def test_the_bulk_limit_defaults_where_redis_refuses_config() -> None:
    class Managed:  # a managed Redis: CONFIG is not offered
        def config_get(self, *args: object, **kwargs: object) -> object:
            raise rx.ResponseError("unknown command 'CONFIG'")

    class Small:
        def config_get(self, *args: object, **kwargs: object) -> object:
            return {"proto-max-bulk-len": "1048576"}

    assert max_bulk_bytes(Managed()) == DEFAULT_MAX_BULK_BYTES == 512 * 1024 * 1024  # type: ignore[arg-type]
    assert max_bulk_bytes(Small()) == 1048576  # type: ignore[arg-type]


def test_a_node_url_brackets_an_ipv6_address() -> None:
    """A TLS cluster is reached through a URL: an IPv6 node's address needs its brackets
    back (redis-py read ``redis://::1:6379``'s port as ``:1:6379``)."""
    (host, port), (host6, port6) = parse_addresses("127.0.0.1:7000,[::1]:7001")
    assert node_url(host, port) == "redis://127.0.0.1:7000"
    assert node_url(host6, port6) == "redis://[::1]:7001"
    url = urlsplit(node_url(host6, port6))
    assert (url.hostname, url.port) == ("::1", 7001)
