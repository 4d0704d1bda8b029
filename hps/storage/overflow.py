"""Victim choice for L2 capacity limits (``overflow_policy``), shared by the L2 backends."""

from __future__ import annotations

import numpy as np

TICK_MASK = 0xFFFFFFFF
"""Row ticks are uint32 (4 bytes a row) and wrap: the backends hand out ``tick & TICK_MASK``
and order rows by their age since the latest tick, which survives the wrap."""


MIN_RESOLUTION = 1 / 64
"""The least share of the limit one resolution evicts in the in-memory backends."""


def rows_to_keep(limit: int, target: float) -> int:
    """Rows an in-memory table keeps when it resolves an overflow of ``limit`` rows:
    ``target`` of it, and at least ``MIN_RESOLUTION`` of it below. Each resolution ranks the
    whole table, so a target of 1.0 (evict just the excess) would rank it again on every
    insert past the limit."""
    return max(0, min(int(limit * target), limit - max(1, int(limit * MIN_RESOLUTION))))


def choose_victims(
    policy: str,
    n: int,
    live: int,
    ticks: np.ndarray | None,
    rng: np.random.Generator,
    now: int,
) -> np.ndarray:
    """Positions, among ``live`` rows, of ``n`` rows to evict.

    ``ticks`` (uint32, one per live row) are last-access ticks for ``evict_least_used`` and
    insert ticks for ``evict_oldest``; ``now`` is the latest tick handed out. The oldest go
    first, by age ``now - tick`` modulo 2^32: a counter that wrapped keeps the order (only a
    row untouched for 2^32 ticks would look new). ``evict_random`` ignores them.
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
    ages = np.uint32(now & TICK_MASK) - ticks.astype(np.uint32)  # wraps modulo 2^32
    return np.argpartition(ages, live - n)[live - n :]
