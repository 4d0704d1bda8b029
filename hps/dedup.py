"""Batch key de-duplication: each distinct key of a batch is looked up or written once."""

from __future__ import annotations

import numpy as np

from hps.types import Keys, Vectors


def unique_inverse(keys: Keys) -> tuple[Keys, np.ndarray]:
    """``(uniq, inverse)`` with ``uniq[inverse] == keys`` and ``uniq`` sorted.

    The same result as ``np.unique(keys, return_inverse=True)`` at about half its cost:
    one unstable argsort instead of NumPy's stable sort.
    """
    n = keys.size
    if n == 0:
        return keys.copy(), np.empty(0, dtype=np.intp)
    order = np.argsort(keys)
    ordered = keys[order]
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    inverse = np.empty(n, dtype=np.intp)
    inverse[order] = np.cumsum(first) - 1
    return ordered[first], inverse


def last_occurrence(keys: Keys, values: Vectors) -> tuple[Keys, Vectors]:
    """Drop duplicate keys, keeping each key's last vector (upsert order)."""
    uniq, idx = np.unique(keys[::-1], return_index=True)
    if uniq.size == keys.size:
        return keys, values
    last = keys.size - 1 - idx
    return keys[last], values[last]
