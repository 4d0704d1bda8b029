"""Batch key de-duplication: each distinct key of a batch is looked up or written once."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

from hps.types import Keys

G = TypeVar("G", bound=np.generic)


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


def last_occurrence(keys: Keys, values: npt.NDArray[G]) -> tuple[Keys, npt.NDArray[G]]:
    """Drop duplicate keys, keeping each key's last row (upsert order; any dtype)."""
    if bool((keys[1:] > keys[:-1]).all()):  # ascending, so no repeat (the applier's batches)
        return keys, values
    uniq, idx = np.unique(keys[::-1], return_index=True)
    if uniq.size == keys.size:
        return keys, values
    last = keys.size - 1 - idx
    return keys[last], values[last]
