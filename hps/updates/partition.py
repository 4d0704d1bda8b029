"""Key → partition, and packing a batch into messages (pure NumPy, no Kafka)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from hps.types import Keys

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def key_hash(keys: Keys) -> np.ndarray:
    """splitmix64's finaliser over the int64 keys (as uint64): a documented, portable hash."""
    z = np.asarray(keys, dtype=np.int64).view(np.uint64) + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def partition_of(keys: Keys, num_partitions: int) -> np.ndarray:
    """The partition of each key: ``key_hash(key) % num_partitions`` (int32)."""
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    return (key_hash(keys) % np.uint64(num_partitions)).astype(np.int32)


def split_by_partition(
    keys: Keys, num_partitions: int, max_rows: int
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(partition, row indices)`` chunks of at most ``max_rows`` rows.

    Rows keep their original relative order inside a partition (stable sort), so two updates
    of one key in one batch keep their order on the wire.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    parts = partition_of(keys, num_partitions)
    order = np.argsort(parts, kind="stable")
    counts = np.bincount(parts, minlength=num_partitions)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    for p in np.flatnonzero(counts):
        rows = order[bounds[p] : bounds[p + 1]]
        for lo in range(0, rows.size, max_rows):
            yield int(p), rows[lo : lo + max_rows]
