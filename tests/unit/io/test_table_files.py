"""Keys of any integer dtype and byte order become int64 keys, or are refused, never wrapped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.errors import FormatError
from hps.io.npy import read_npy_pair
from hps.io.table_files import int64_keys
from tests.helpers import rows

BIG = 2**63 + 5  # beyond int64: a cast would wrap it to -9223372036854775803


@pytest.mark.parametrize("dtype", ["<u8", ">u8"])
def test_unsigned_keys_beyond_int64_are_refused_in_either_byte_order(dtype: str) -> None:
    keys = np.array([7, BIG, 2**64 - 1], dtype=dtype)
    with pytest.raises(
        FormatError,
        match=rf"^k.npy: key {BIG} at row 11 does not fit in int64 \(2 such keys in rows 10-12\)$",
    ):
        int64_keys(keys, "k.npy", 10)


@pytest.mark.parametrize("dtype", ["<u8", ">u8", "<i8", ">i8", ">u4", ">i4", ">i2", "u1"])
def test_keys_that_fit_are_read_by_value_whatever_their_byte_order(dtype: str) -> None:
    values = [0, 1, 7, 200, min(int(np.iinfo(dtype).max), 2**63 - 1)]
    if np.dtype(dtype).kind == "i":
        values.append(int(np.iinfo(dtype).min))
    keys = int64_keys(np.array(values, dtype=dtype), "k.npy", 0)
    assert keys.dtype == np.int64 and keys.tolist() == values


def test_big_endian_npy_keys_beyond_int64_are_refused_like_little_endian(tmp_path: Path) -> None:
    np.save(tmp_path / "v.npy", rows(np.arange(2), 4))
    messages = []
    for dtype in ("<u8", ">u8"):
        np.save(tmp_path / "k.npy", np.array([BIG, 7], dtype=dtype))
        with pytest.raises(FormatError, match="does not fit in int64") as err:
            list(read_npy_pair(tmp_path / "k.npy", tmp_path / "v.npy", 4))
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert f"key {BIG} at row 0" in messages[0]


def test_big_endian_signed_npy_keys_are_read_by_value(tmp_path: Path) -> None:
    keys = np.array([-(2**62), 5, 2**63 - 1, 2**40 + 3], dtype=">i8")
    np.save(tmp_path / "k.npy", keys)
    np.save(tmp_path / "v.npy", rows(np.arange(4), 4))
    [(k, v)] = list(read_npy_pair(tmp_path / "k.npy", tmp_path / "v.npy", 4))
    assert k.dtype == np.int64 and k.tolist() == keys.tolist()
    np.testing.assert_array_equal(v, rows(np.arange(4), 4))
