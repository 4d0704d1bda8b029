"""Placement on its own: upserts in place, free rows first, victims by priority, the window
they are chosen from, admission, and the pinned set's room (EmbeddingCache's tests cover the
same through the cache)."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from hps.cache import placement as placement_module
from hps.cache.placement import SCAN_PER_VICTIM, Placement
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


def aged(xp: ModuleType, monkeypatch: pytest.MonkeyPatch, oldest: int) -> Placement:
    """A full 64-row LRU cache whose eviction window is 16 rows for one victim; row ``r``
    was last used at tick 100 + r, but row ``oldest`` at tick 2."""
    monkeypatch.setattr(placement_module, "MIN_SCAN_ROWS", SCAN_PER_VICTIM)
    p = placement(xp, 64)
    upsert(p, list(range(64)), tick=1)
    ticks = np.arange(100, 164, dtype=np.int64)
    ticks[oldest] = 2
    p.store.ticks[:] = xp.asarray(ticks)
    return p


def key_at(p: Placement, row: int) -> int:
    return int(p.store.row_keys[row])


def test_victims_come_from_the_window_at_the_hand_which_sweeps_the_arena(
    xp: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = aged(xp, monkeypatch, oldest=40)
    keys = [key_at(p, r) for r in range(64)]
    # The oldest row of the arena is 40, but the first window is rows 0-15: row 0 goes.
    assert upsert(p, [1000], tick=200) == [0] and p.hand == 16
    assert upsert(p, [1001], tick=201) == [16] and p.hand == 32
    assert upsert(p, [1002], tick=202) == [40] and p.hand == 48  # its turn came
    gone = xp.asarray(np.array([keys[0], keys[16], keys[40]], np.int64))
    assert [int(r) for r in to_host(p.store.lookup(gone))] == [-1, -1, -1]
    assert p.stats["evictions"] == 3 and len(p.store) == 64
    upsert(p, [1003], tick=203)
    assert p.hand == 0  # the hand wrapped: every row comes up once per sweep


def test_rows_just_upserted_or_pinned_stay_and_a_window_too_full_of_them_scans_all(
    xp: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = aged(xp, monkeypatch, oldest=40)
    # Row 0, the window's oldest, is written again by the same batch: row 1 goes instead.
    assert upsert(p, [key_at(p, 0), 1000], tick=200)[1] == 1 and p.hand == 16
    p.store.pinned[16:32] = True  # the next window holds no evictable row
    assert upsert(p, [1001], tick=201) == [40]  # the whole arena's oldest, exactly
    assert p.hand == 16  # a whole scan does not move the hand


def test_a_window_as_large_as_the_arena_is_the_arena(xp: ModuleType) -> None:
    p = placement(xp, 64)  # 64 rows: below MIN_SCAN_ROWS, every eviction is exact
    upsert(p, list(range(64)), tick=1)
    ticks = np.arange(100, 164, dtype=np.int64)
    ticks[50] = 2
    p.store.ticks[:] = xp.asarray(ticks)
    assert upsert(p, [1000], tick=200) == [50] and p.hand == 0
