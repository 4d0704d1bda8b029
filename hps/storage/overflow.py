"""Victim choice for L2 capacity limits (``overflow_policy``), shared by the L2 backends."""

from __future__ import annotations

import numpy as np


def choose_victims(
    policy: str, n: int, live: int, ticks: np.ndarray | None, rng: np.random.Generator
) -> np.ndarray:
    """Positions, among ``live`` rows, of ``n`` rows to evict.

    ``ticks`` (one per live row) are last-access ticks for ``evict_least_used`` and insert
    ticks for ``evict_oldest``: the smallest go first. ``evict_random`` ignores them.
    """
    n = min(n, live)
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    if policy == "evict_random":
        return rng.choice(live, size=n, replace=False)
    if ticks is None:
        raise ValueError(f"{policy} needs per-row ticks")
    if n == live:
        return np.arange(live)
    return np.argpartition(ticks, n - 1)[:n]
