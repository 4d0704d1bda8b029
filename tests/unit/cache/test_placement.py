"""Placement on its own: upserts in place, free rows first, victims by priority, admission,
and the pinned set's room (EmbeddingCache's tests cover the same through the cache)."""

from __future__ import annotations

from types import ModuleType

import numpy as np

from hps.cache.placement import Placement
from hps.cache.policies import make_policy
from hps.cache.rows import RowStore
from hps.cache.xp import to_host
from hps.rowformat import FLOAT32, RowFormat

STATS = ("inserts", "rejected", "evictions")


def placement(
    xp: ModuleType, capacity: int, policy: str = "lru", pinned: int = 0, fmt: RowFormat = FLOAT32
) -> Placement:
    store = RowStore(capacity, 2, xp, fmt)
    chosen = make_policy(policy, capacity, store.ticks, xp, window=0)
    return Placement(store, chosen, xp, pinned, dict.fromkeys(STATS, 0))


def upsert(p: Placement, keys: list[int], tick: int, *, force: bool = False) -> list[int]:
    xp = p.xp
    kd = xp.asarray(np.array(keys, dtype=np.int64))
    values = xp.asarray(
        p.store.fmt.encode(np.repeat(np.array(keys, np.float32)[:, None], 2, axis=1))
    )
    ok = xp.ones(len(keys), dtype=bool)
    rows = p.upsert(kd, values, ok, force, tick)
    return [int(r) for r in (rows.get() if hasattr(rows, "get") else rows)]


def test_free_rows_first_then_the_lowest_priority_goes(xp: ModuleType, fmt: RowFormat) -> None:
    p = placement(xp, 2, fmt=fmt)
    first = upsert(p, [1, 2], tick=1)
    assert sorted(first) == [0, 1] and p.stats["inserts"] == 2
    upsert(p, [1], tick=2)  # an upsert in place: key 2 is now the oldest
    [row] = upsert(p, [3], tick=3)
    assert row == first[1] and p.stats["evictions"] == 1
    assert int(p.store.lookup(xp.asarray(np.array([2], np.int64)))[0]) == -1
    stored = p.store.values[row : row + 1]  # key 3's stored row, as it was given
    assert stored.dtype == fmt.dtype and stored.shape == (1, fmt.width(2))
    np.testing.assert_array_equal(fmt.decode(to_host(stored), 2), [[3.0, 3.0]])


def test_admission_turns_away_a_colder_newcomer_unless_forced(xp: ModuleType) -> None:
    p = placement(xp, 1, policy="frequency")
    upsert(p, [1], tick=1)
    p.policy.counts[:] = 10  # key 1 is hot; the sketch has never seen key 2
    assert upsert(p, [2], tick=2) == [-1] and p.stats["rejected"] == 1
    assert upsert(p, [2], tick=3, force=True) != [-1]


def test_pin_stops_at_the_room_left(xp: ModuleType) -> None:
    p = placement(xp, 4, pinned=2)
    p.pin(xp.asarray(np.array(upsert(p, [1, 2, 3], tick=1), dtype=np.int64)))
    assert int(p.store.pinned.sum()) == 2
    p.pin(xp.asarray(np.array([-1], dtype=np.int64)))  # not admitted: nothing to pin
    assert int(p.store.pinned.sum()) == 2
