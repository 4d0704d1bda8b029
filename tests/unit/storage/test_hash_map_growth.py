"""The in-process L2 grows its arena in place (hps/storage/hash_map.py ``_grow``), and hands
out freed rows before it grows.

Filling a table from empty must keep every row through each growth, whatever the row format,
with or without the overflow ticks, and must never hold the old and the new arena at once:
the peak is the table itself, not 1.7x of it as when each growth copied into a new array.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from hps.config import NO_LIMIT
from hps.index import EMPTY
from hps.rowformat import ROW_DTYPES, RowDtype
from hps.storage.hash_map import HashMapStore
from hps.types import TableSpec

BATCH = 4096


def _rows(spec: TableSpec, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    keys = rng.permutation(n * 4)[:n].astype(np.int64)
    return keys, spec.fmt.encode(rng.uniform(-1, 1, (n, spec.dim)).astype(np.float32))


def _fill(store: HashMapStore, spec: TableSpec, keys: np.ndarray, values: np.ndarray) -> None:
    for lo in range(0, keys.size, BATCH):
        store.insert(spec.name, keys[lo : lo + BATCH], values[lo : lo + BATCH])


@pytest.mark.parametrize("row_dtype", ROW_DTYPES)
@pytest.mark.parametrize("bounded", [False, True])
def test_rows_survive_every_growth(row_dtype: RowDtype, bounded: bool) -> None:
    store = HashMapStore(overflow_margin=10**9 if bounded else NO_LIMIT, seed=0)
    spec = TableSpec(model="m", table="t", dim=16, row_dtype=row_dtype)
    store.open_table(spec)
    keys, values = _rows(spec, 50_001)
    _fill(store, spec, keys, values)  # about twenty growths from 1,024 rows
    got, found = store.fetch(spec.name, keys)
    assert found.all()
    np.testing.assert_array_equal(got, values)
    dumped = np.concatenate([k for k, _ in store.dump(spec.name)])
    np.testing.assert_array_equal(np.sort(dumped), np.sort(keys))
    t = store._tables[spec.name]
    assert t.capacity >= keys.size > 1024
    assert (t.row_keys[t.top :] == EMPTY).all()  # rows never handed out hold no key
    assert (t.ticks is not None) == bounded


def test_growing_never_holds_two_arenas() -> None:
    store = HashMapStore()
    spec = TableSpec(model="m", table="t", dim=32)
    store.open_table(spec)
    keys, values = _rows(spec, 200_000)
    tracemalloc.start()
    try:
        _fill(store, spec, keys, values)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Copying into a new array at each growth peaked at about 1.7x the table.
    assert peak < 1.25 * store.nbytes(spec.name)


def test_freed_rows_are_handed_out_once_before_the_arena_grows() -> None:
    store = HashMapStore()
    spec = TableSpec("m", "t", 4)
    store.open_table(spec)
    keys, values = _rows(spec, 1000)
    store.insert(spec.name, keys, values)
    table = store._tables[spec.name]
    top = table.top
    for lo in (0, 100, 350):  # three removals: three chunks of free rows
        store.remove(spec.name, keys[lo : lo + 50])
    # Batches that take a chunk in part, across chunks, and past the last one.
    new = np.arange(10**6, 10**6 + 170, dtype=np.int64)
    for part in (new[:30], new[30:100], new[100:170]):
        store.insert(spec.name, part, spec.fmt.encode(np.full((part.size, 4), 7.0, np.float32)))
    assert table.top == top + 20  # 150 freed rows reused, then 20 fresh ones
    rows = table.index.lookup(np.concatenate([keys[50:100], keys[150:350], keys[400:], new]))
    assert (rows >= 0).all() and np.unique(rows).size == rows.size  # one key a row
    got, found = store.fetch(spec.name, new)
    assert found.all() and (spec.fmt.decode(got, 4) == 7.0).all()


def test_a_batch_far_past_the_margin_grows_the_table_to_about_the_margin() -> None:
    """A fill from L3 inserts 262,144 rows at a time: a bounded table resolves its overflow
    every MIN_INSERT_SLICE / margin / 16 keys of them, so its arena (which never shrinks)
    stays near the margin that ``hps plan`` sizes it by, not the margin plus the batch."""
    margin = 20_000
    store = HashMapStore(overflow_margin=margin, seed=1)
    spec = TableSpec("m", "t", 4)
    store.open_table(spec)
    keys, values = _rows(spec, 300_000)
    store.insert(spec.name, keys, values)
    table = store._tables[spec.name]
    assert store.size(spec.name) <= margin
    assert table.capacity < 2 * margin  # before: 300,000 rows of arena
    got, found = store.fetch(spec.name, keys)
    assert found.sum() == store.size(spec.name)  # the rows kept are whole and right
    np.testing.assert_array_equal(got[found], values[found])
