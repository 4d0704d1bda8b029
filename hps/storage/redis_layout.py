"""The Redis L2's data layout: partitioning, Redis key names, field bytes (docs/redis.md).

Pure functions over whole NumPy batches, shared by the store and ``hps bench storage``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import itemgetter
from typing import Any, TypeAlias, TypeVar

import numpy as np

from hps.index import GOLDEN
from hps.types import Keys

_SHIFT = np.uint64(32)
T = TypeVar("T")

Group = tuple[int, int, int]
"""``(partition, lo, hi)``: keys ``lo:hi`` of a batch sorted by partition are in ``partition``."""
Reply: TypeAlias = Any
"""An item of a Redis reply: what redis-py returns depends on the command and the protocol."""


NODE_RECORDS = b"hps_vr{nodes}"
"""The hash of the serving nodes' version records, a field per node (one hash slot)."""


def partition_of(keys: Keys, num_partitions: int) -> np.ndarray:
    """Partition index of each key (vectorised; stable across processes and releases)."""
    mixed = keys.view(np.uint64) * GOLDEN  # Fibonacci hashing; wraps modulo 2**64
    return ((mixed >> _SHIFT) % np.uint64(num_partitions)).astype(np.intp)


def hash_name(table: str, partition: int) -> bytes:
    return f"hps_et{{{table}/p{partition}}}".encode()


def stamp_name(table: str, partition: int) -> bytes:
    return f"hps_ts{{{table}/p{partition}}}".encode()


def meta_name(table: str) -> bytes:
    """The string recording the table's row format and dimension (JSON)."""
    return f"hps_tm{{{table}}}".encode()


def group_by_partition(keys: Keys, num_partitions: int) -> tuple[np.ndarray, list[Group]]:
    """``order`` sorting keys by partition and ``[(partition, lo, hi)]`` runs in that order."""
    if num_partitions == 1:
        return np.arange(keys.size), [(0, 0, keys.size)] if keys.size else []
    part = partition_of(keys, num_partitions)
    small = part.astype(np.uint16) if num_partitions <= 65536 else part
    order = np.argsort(small, kind="stable")  # radix sort for 16-bit ints
    counts = np.bincount(part, minlength=num_partitions)
    ends = np.cumsum(counts)
    used = np.flatnonzero(counts)
    return order, list(
        zip(used.tolist(), (ends - counts)[used].tolist(), ends[used].tolist(), strict=True)
    )


def unsort(replies: list[T], order: np.ndarray, groups: int) -> Sequence[T]:
    """Replies of keys taken in ``order`` (partition order), put back in request order."""
    if groups <= 1:  # one partition: the stable sort left the keys in request order
        return replies
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    reordered: tuple[T, ...] = itemgetter(*inverse.tolist())(replies)  # >= 2 keys: a tuple
    return reordered


def pair_items(reply: Reply) -> tuple[list[Reply], list[Reply]]:
    """(firsts, seconds) of a pair reply, flat ``[a, b, ...]`` or nested ``[[a, b], ...]``

    (redis-py's shape for WITHVALUES / WITHSCORES replies differs between its versions)."""
    flat = list(chain.from_iterable(x if isinstance(x, list | tuple) else (x,) for x in reply))
    return flat[0::2], flat[1::2]


def interleave(a: list[T], b: list[T]) -> list[T]:
    out = a + b  # the length of the result; every item is replaced below
    out[0::2] = a
    out[1::2] = b
    return out


REDIS_ZSET_ENTRY = 96  # skiplist node + dict entry + member sds, per row, with overflow_margin


def _jemalloc(n: int) -> int:
    """Size class jemalloc serves an ``n``-byte allocation from (4 classes per doubling)."""
    if n <= 16:
        return 8 if n <= 8 else 16
    step = 1 << max(4, (n - 1).bit_length() - 3)
    return -(-n // step) * step


def redis_bytes_per_row(row_bytes: int, bounded: bool) -> float:
    """Estimated Redis memory per stored row of ``row_bytes`` bytes in a partition hash
    (hashtable encoding)."""
    value = row_bytes
    value_sds = _jemalloc(value + (3 if value < 256 else 5) + 1)
    field_sds = _jemalloc(8 + 3 + 1)
    entry = _jemalloc(24)
    bucket = 8 * 1.5  # the bucket array is 1-2 pointers per entry
    return value_sds + field_sds + entry + bucket + (REDIS_ZSET_ENTRY if bounded else 0)
