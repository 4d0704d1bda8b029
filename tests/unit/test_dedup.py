"""Batch key de-duplication."""

from __future__ import annotations

import numpy as np

from hps.dedup import last_occurrence, unique_inverse


def test_last_occurrence_keeps_each_keys_last_row() -> None:
    keys = np.array([4, 1, 4, 2, 1], np.int64)
    rows = np.arange(5, dtype=np.float32)[:, None]
    k, v = last_occurrence(keys, rows)
    assert dict(zip(k.tolist(), v[:, 0].tolist(), strict=True)) == {1: 4.0, 2: 3.0, 4: 2.0}


def test_last_occurrence_leaves_distinct_keys_as_they_are() -> None:
    rows = np.arange(4, dtype=np.float32)[:, None]
    for keys in (np.array([1, 5, 9, 12], np.int64), np.array([9, 1, 12, 5], np.int64)):
        k, v = last_occurrence(keys, rows)
        assert k is keys and v is rows
    empty = np.empty(0, np.int64)
    assert last_occurrence(empty, rows[:0])[0].size == 0


def test_unique_inverse_rebuilds_the_keys() -> None:
    keys = np.array([7, -3, 7, 0, -3, 7], np.int64)
    uniq, inverse = unique_inverse(keys)
    assert uniq.tolist() == [-3, 0, 7]
    np.testing.assert_array_equal(uniq[inverse], keys)
