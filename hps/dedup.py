"""Batch key de-duplication (seed 004's DSF): each distinct key is looked up once."""

from __future__ import annotations

import numpy as np

from hps.types import Keys


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
