"""KeyIndex against a plain dict: random batches of inserts, removals and lookups."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hps.cache.xp import available_xps, to_host
from hps.errors import InvalidValueError
from hps.index import EMPTY, GROUP, TOMBSTONE, TOMBSTONE_ROOM, KeyIndex, compiled, slots_for
from hps.types import TableSpec
from hps.validate import as_rows

XPS = available_xps()
# (xp, compiled loops): the host index with and without numba's loops, and the device one
IMPLS = [(np, True), (np, False)] + [(xp, False) for xp in XPS if xp is not np]
IMPL_IDS = ["numpy-compiled" if c else xp.__name__ for xp, c in IMPLS]

# Small key universes force collisions, full groups and long probe chains.
keys_st = st.lists(st.integers(-(2**63) + 2, 2**63 - 1) | st.integers(0, 40), max_size=30)
ops_st = st.lists(st.tuples(st.sampled_from(["insert", "remove", "lookup"]), keys_st), max_size=25)


def _check(index: KeyIndex, model: dict[int, int], xp: ModuleType) -> None:
    assert len(index) == len(model)
    keys, rows = index.items()
    assert dict(zip(to_host(keys).tolist(), to_host(rows).tolist(), strict=True)) == model
    reserved = xp.asarray(np.array([EMPTY, TOMBSTONE, 7, EMPTY], dtype=np.int64))
    assert to_host(index.lookup(reserved)).tolist() == [-1, -1, model.get(7, -1), -1]


@pytest.mark.parametrize(("xp", "compiled_loops"), IMPLS, ids=IMPL_IDS)
@settings(max_examples=150, deadline=None)
@given(ops=ops_st, capacity=st.sampled_from([1, 4, 16]))
def test_index_matches_a_dict(
    xp: ModuleType, compiled_loops: bool, ops: list[tuple[str, list[int]]], capacity: int
) -> None:
    index, model, next_row = KeyIndex(capacity, xp=xp, compiled_loops=compiled_loops), {}, 0
    for op, raw in ops:
        keys = np.array(raw, dtype=np.int64)
        kd = xp.asarray(keys)
        if op == "insert":
            fresh = [k for k in dict.fromkeys(raw) if k not in model]
            rows = np.arange(next_row, next_row + len(fresh), dtype=np.int64)
            next_row += len(fresh)
            index.insert(xp.asarray(np.array(fresh, dtype=np.int64)), xp.asarray(rows))
            model.update(zip(fresh, rows.tolist(), strict=True))
        elif op == "remove":
            got = to_host(index.remove(kd)).tolist()
            assert got == [model.get(k, -1) for k in raw]
            for k in raw:
                model.pop(k, None)
        else:
            assert to_host(index.lookup(kd)).tolist() == [model.get(k, -1) for k in raw]
        _check(index, model, xp)


@pytest.mark.parametrize(("xp", "compiled_loops"), IMPLS, ids=IMPL_IDS)
def test_growth_rehash_and_tombstone_reuse(xp: ModuleType, compiled_loops: bool) -> None:
    index = KeyIndex(8, xp=xp, compiled_loops=compiled_loops)
    start_slots = index.slots
    keys = np.arange(1, 2001, dtype=np.int64) * 7919
    index.insert(xp.asarray(keys), xp.asarray(np.arange(keys.size)))
    assert index.slots > start_slots and len(index) == keys.size
    # Churn: remove and re-insert many times; tombstones must not fill the table.
    for round_ in range(20):
        drop = keys[round_ * 50 : round_ * 50 + 50]
        index.remove(xp.asarray(drop))
        index.insert(xp.asarray(drop + 1), xp.asarray(np.arange(50)))
        keys[round_ * 50 : round_ * 50 + 50] = drop + 1
    rows = to_host(index.lookup(xp.asarray(keys)))
    assert (rows >= 0).all() and len(index) == keys.size
    assert index.slots <= 2 * slots_for(keys.size)


@pytest.mark.parametrize(("xp", "compiled_loops"), IMPLS, ids=IMPL_IDS)
def test_a_full_index_with_one_slot_of_room_is_not_rebuilt_on_every_insert(
    xp: ModuleType, compiled_loops: bool
) -> None:
    # 511 keys at load 0.5: 1,024 slots and one slot of room below the load. Each step
    # removes a key and inserts a new one, as a full cache does; every removal leaves a
    # tombstone, and the tombstones have TOMBSTONE_ROOM of the slots above the load.
    index = KeyIndex(511, xp=xp, max_load=0.5, compiled_loops=compiled_loops)
    assert index.slots == 1024
    model = {k: k for k in range(1, 512)}
    index.insert(xp.asarray(np.array(list(model), np.int64)), xp.asarray(np.array(list(model))))
    arrays, rebuilds = index.slot_keys, 0
    for step in range(300):
        index.remove(xp.asarray(np.array([step + 1], np.int64)))
        index.insert(xp.asarray(np.array([1000 + step], np.int64)), xp.asarray(np.array([step])))
        del model[step + 1]
        model[1000 + step] = step
        rebuilds += index.slot_keys is not arrays
        arrays = index.slot_keys
    room = int(TOMBSTONE_ROOM * 0.5 * 1024)
    assert rebuilds <= 300 // room and index.slots == 1024  # not ~300, and never grown
    _check(index, model, xp)


@pytest.mark.parametrize(("xp", "compiled_loops"), IMPLS, ids=IMPL_IDS)
def test_reserved_keys_are_never_found_and_removing_them_changes_nothing(
    xp: ModuleType, compiled_loops: bool
) -> None:
    index = KeyIndex(4, xp=xp, compiled_loops=compiled_loops)
    index.insert(xp.asarray(np.array([5, 6], dtype=np.int64)), xp.asarray(np.array([0, 1])))
    index.remove(xp.asarray(np.array([5], dtype=np.int64)))  # leaves a TOMBSTONE slot
    reserved = xp.asarray(np.array([EMPTY, TOMBSTONE], dtype=np.int64))
    assert to_host(index.lookup(reserved)).tolist() == [-1, -1]
    assert to_host(index.remove(reserved)).tolist() == [-1, -1]
    assert len(index) == 1 and to_host(index.lookup(xp.asarray(np.array([6])))).tolist() == [1]
    with pytest.raises(InvalidValueError, match="reserved"):
        as_rows(TableSpec("m", "t", 1), np.array([1, EMPTY], dtype=np.int64), np.ones((2, 1)))


@pytest.mark.parametrize(("xp", "compiled_loops"), IMPLS, ids=IMPL_IDS)
def test_duplicate_keys_in_one_removal_count_once(xp: ModuleType, compiled_loops: bool) -> None:
    index = KeyIndex(4, xp=xp, compiled_loops=compiled_loops)
    index.insert(xp.asarray(np.array([1, 2, 3], dtype=np.int64)), xp.asarray(np.arange(3)))
    rows = index.remove(xp.asarray(np.array([2, 2, 9], dtype=np.int64)))
    assert to_host(rows).tolist() == [1, 1, -1]
    assert len(index) == 2
    _check(index, {1: 0, 3: 2}, xp)


@pytest.mark.skipif(compiled() is None, reason="numba is not installed")
def test_compiled_and_numpy_rounds_read_each_others_slots() -> None:
    """Both write the layout the device kernels probe: same homes, same probe sequence."""
    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(-(2**62), 2**62, 5000))
    jit, rounds = KeyIndex(64), KeyIndex(64, compiled_loops=False)
    half = keys.size // 2
    for writer in (jit, rounds):  # same history in each: inserts, removals, re-inserts
        writer.insert(keys[:half], np.arange(half))
        writer.remove(keys[: half // 3])
        writer.insert(keys[half:], np.arange(half, keys.size))
    assert jit.slots == rounds.slots and jit._tombs == rounds._tombs
    want = np.where(np.arange(keys.size) < half // 3, -1, np.arange(keys.size))
    for reader, writer in ((jit, rounds), (rounds, jit)):
        reader.slot_keys[:], reader.slot_rows[:] = writer.slot_keys, writer.slot_rows
        assert reader.lookup(keys).tolist() == want.tolist()


def test_one_group_is_one_cache_line() -> None:
    index = KeyIndex(1000)
    assert index.slots % GROUP == 0
    assert index.slot_keys.reshape(-1, GROUP).strides[0] == 64


def test_slot_groups_and_rows_start_on_cache_lines() -> None:
    """A slot group (8 keys) and a dim-16 row are one 64-byte line each, not two."""
    from hps.cache.rows import RowStore
    from hps.index import CACHE_LINE, aligned_full
    from hps.rowformat import FORMATS

    for shape in (5, (3, 7), (100_000, 16)):
        arr = aligned_full(np, shape, -1, np.int32)
        assert arr.ctypes.data % CACHE_LINE == 0 and arr.shape == np.empty(shape).shape
        assert arr.dtype == np.int32 and (arr == -1).all() and arr.flags["C_CONTIGUOUS"]
    rows = RowStore(100_000, 16, np)
    assert rows.values.ctypes.data % CACHE_LINE == 0
    assert rows.index.slot_keys.ctypes.data % CACHE_LINE == 0
    for fmt in FORMATS.values():  # the arena holds the table's stored rows, aligned alike
        rows = RowStore(1000, 16, np, fmt)
        assert rows.values.shape == (1000, fmt.width(16)) and rows.values.dtype == fmt.dtype
        assert rows.values.ctypes.data % CACHE_LINE == 0 and not rows.values.any()
        assert rows.kernel_values.ctypes.data == rows.values.ctypes.data
