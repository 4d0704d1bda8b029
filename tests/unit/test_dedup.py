"""Batch key de-duplication and the stored key order."""

from __future__ import annotations

import numpy as np

from hps.dedup import (
    first_occurrences,
    in_stored_order,
    last_occurrence,
    stored_order,
    unique_inverse,
)
from hps.storage.keybytes import key_bytes


def test_last_occurrence_keeps_each_keys_last_row() -> None:
    keys = np.array([4, 1, 4, 2, 1], np.int64)
    rows = np.arange(5, dtype=np.float32)[:, None]
    k, v = last_occurrence(keys, rows)
    assert dict(zip(k.tolist(), v[:, 0].tolist(), strict=True)) == {1: 4.0, 2: 3.0, 4: 2.0}


def test_last_occurrence_leaves_distinct_keys_as_they_are() -> None:
    rows = np.arange(4, dtype=np.float32)[:, None]
    in_order = (np.array([1, 5, 9, 12], np.int64), np.array([256, 1, 2, -1], np.int64))
    for keys in (*in_order, np.array([9, 1, 12, 5], np.int64)):
        k, v = last_occurrence(keys, rows)
        assert k is keys and v is rows
    empty = np.empty(0, np.int64)
    assert last_occurrence(empty, rows[:0])[0].size == 0


def test_unique_inverse_rebuilds_the_keys() -> None:
    keys = np.array([7, -3, 7, 0, -3, 7], np.int64)
    uniq, inverse = unique_inverse(keys)
    assert uniq.tolist() == [-3, 0, 7]
    np.testing.assert_array_equal(uniq[inverse], keys)


def test_stored_order_is_the_bytewise_order_of_the_stored_keys() -> None:
    keys = np.array([256, 1, -1, 0, 2**62, -(2**63), 255, 65536], np.int64)
    ordered = [key_bytes(keys)[i] for i in stored_order(keys)]
    assert ordered == sorted(key_bytes(keys))


def test_equal_keys_keep_their_order() -> None:
    keys = np.array([9, 3, 9, 3, 1, 9], np.int64)
    assert stored_order(keys).tolist() == [4, 1, 3, 0, 2, 5]
    assert stored_order(np.array([], np.int64)).tolist() == []


def test_in_stored_order_means_distinct_and_ordered() -> None:
    assert in_stored_order(np.array([256, 1, 257, -1], np.int64))
    assert not in_stored_order(np.array([1, 256], np.int64))
    assert not in_stored_order(np.array([1, 1], np.int64))
    assert in_stored_order(np.array([], np.int64))


def test_first_occurrences_keep_the_order_of_a_hottest_first_list() -> None:
    keys = np.array([9, 3, 9, 7, 3, 1], dtype=np.int64)
    assert first_occurrences(keys).tolist() == [9, 3, 7, 1]
    assert first_occurrences(np.empty(0, np.int64)).size == 0
