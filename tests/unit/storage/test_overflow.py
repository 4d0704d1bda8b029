"""L2 eviction order across the wrap of the uint32 row ticks (hps/storage/overflow.py), and
how far one resolution goes.

A store stamps rows with a uint32 tick per batch; after 2^32 batches (two days at 25k
batches a second) the counter wraps. The in-process hash map then failed every insert
(NumPy refuses a Python int past 2^32 - 1 in a uint32 array), and the shared-memory one
evicted its newest rows first. Both must keep serving and keep the order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from hps.storage._shm_layout import HeaderWord
from hps.storage.base import EmbeddingStore
from hps.storage.hash_map import HashMapStore
from hps.storage.multi_process_hash_map import SharedHashMapStore
from hps.storage.overflow import MIN_RESOLUTION, TICK_MASK, choose_victims, rows_to_keep
from hps.types import TableSpec
from tests.helpers import unique_name


def test_the_oldest_go_first_across_the_wrap() -> None:
    now = 3  # the counter wrapped five ticks ago
    ticks = np.array([TICK_MASK - 1, 2, TICK_MASK, 1, 3], dtype=np.uint32)
    rng = np.random.default_rng(0)
    assert sorted(choose_victims("evict_least_used", 2, 5, ticks, rng, now).tolist()) == [0, 2]
    assert sorted(choose_victims("evict_oldest", 3, 5, ticks, rng, now).tolist()) == [0, 2, 3]


SPEC = TableSpec("m", "t", 4)


def _near_wrap(kind: str) -> Iterator[Callable[..., EmbeddingStore]]:
    """Open stores of ``kind`` with table ``SPEC``, their tick counter about to wrap."""
    opened: list[EmbeddingStore] = []

    def open_(**kw: Any) -> EmbeddingStore:
        store: EmbeddingStore
        if kind == "hash_map":
            store = HashMapStore(seed=0, **kw)
            store._tick = TICK_MASK - 2  # type: ignore[attr-defined]
        else:
            store = SharedHashMapStore(unique_name("hps_test_wrap"), 8 << 20, seed=0, **kw)
            store._seg.h[HeaderWord.TICK] = TICK_MASK - 2  # type: ignore[attr-defined]
        opened.append(store)
        store.open_table(SPEC)
        return store

    yield open_
    for store in opened:
        store.close()


@pytest.fixture(params=["hash_map", "multi_process_hash_map"])
def near_wrap(request: pytest.FixtureRequest) -> Iterator[Callable[..., EmbeddingStore]]:
    yield from _near_wrap(request.param)


@pytest.mark.parametrize("policy", ["evict_oldest", "evict_least_used"])
def test_eviction_keeps_its_order_when_the_ticks_wrap(
    near_wrap: Callable[..., EmbeddingStore], policy: str
) -> None:
    store = near_wrap(overflow_margin=1000, overflow_policy=policy, overflow_resolution_target=0.5)
    spec = SPEC
    first = np.arange(0, 600, dtype=np.int64)
    second = np.arange(600, 1000, dtype=np.int64)
    rows = lambda keys: np.repeat(keys.astype(np.float32)[:, None], 4, axis=1)  # noqa: E731
    store.insert(spec.name, first, rows(first))  # the last tick before the wrap
    store.insert(spec.name, second, rows(second))  # the counter wraps about here
    store.fetch(spec.name, first[:100])  # recently used, after the wrap
    third = np.arange(1000, 1100, dtype=np.int64)
    store.insert(spec.name, third, rows(third))
    assert store.size(spec.name) == 500
    _, f_first = store.fetch(spec.name, first[:100])
    _, f_third = store.fetch(spec.name, third)
    assert f_third.all()  # the newest rows stay
    assert f_first.all() == (policy == "evict_least_used")
    got, found = store.fetch(spec.name, np.arange(0, 1100, dtype=np.int64))
    assert found.sum() == 500
    np.testing.assert_array_equal(got[found], rows(np.arange(0, 1100)[found]))


def test_one_resolution_evicts_at_least_a_share_of_the_limit() -> None:
    assert rows_to_keep(1000, 0.8) == 800
    assert rows_to_keep(1000, 1.0) == 1000 - int(1000 * MIN_RESOLUTION)  # not 1000: 984
    assert rows_to_keep(10, 1.0) == 9 and rows_to_keep(1, 1.0) == 0


@pytest.mark.parametrize("policy", ["evict_random", "evict_least_used"])
def test_a_target_of_one_does_not_resolve_on_every_insert(
    near_wrap: Callable[..., EmbeddingStore], policy: str
) -> None:
    store = near_wrap(overflow_margin=640, overflow_policy=policy, overflow_resolution_target=1.0)
    spec = SPEC
    values = np.ones((1, 4), np.float32)
    store.insert(spec.name, np.arange(640, dtype=np.int64), np.ones((640, 4), np.float32))
    sizes = []
    for key in range(1000, 1012):  # one row past the limit, then one a batch
        store.insert(spec.name, np.array([key], dtype=np.int64), values)
        sizes.append(store.size(spec.name))
    # The first went down 10 rows (1/64 of 640) below the limit; ten more fit before the next.
    assert sizes == [630, *range(631, 641), 630]
