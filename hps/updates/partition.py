"""Key → partition, and packing a batch into messages (pure NumPy, no Kafka)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from hps.index import GOLDEN, mix
from hps.types import Keys


def key_hash(keys: Keys) -> np.ndarray:
    """splitmix64 over the int64 keys (as uint64): a documented, portable hash."""
    result: np.ndarray = mix(np.asarray(keys, dtype=np.int64).view(np.uint64) + GOLDEN)
    return result


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
