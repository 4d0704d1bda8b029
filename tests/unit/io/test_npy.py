"""A .npy header is checked against its file: no negative length, and exactly the bytes it
declares, before anything is read or allocated (a FormatError, a 422 at the control plane)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from hps.errors import FormatError
from hps.io.npy import npy_rows, read_npy_pair
from tests.helpers import rows


def npy(shape: tuple[int, ...], dtype: str, payload: bytes = b"") -> bytes:
    """A version-1.0 header declaring ``shape`` and ``dtype``, then ``payload`` as the data."""
    header = {
        "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
        "fortran_order": False,
        "shape": shape,
    }
    b = io.BytesIO()
    np.lib.format.write_array_header_1_0(b, header)
    return b.getvalue() + payload


def save(path: Path, a: np.ndarray) -> int:
    """``a`` saved at ``path``; returns the size of its header."""
    np.save(path, a)
    return path.stat().st_size - a.nbytes


@pytest.mark.parametrize("n", [-5, -1])
def test_a_negative_length_is_refused(tmp_path: Path, n: int) -> None:
    (tmp_path / "k.npy").write_bytes(npy((n,), "<i8"))
    (tmp_path / "v.npy").write_bytes(npy((n, 4), "<f4"))
    with pytest.raises(FormatError, match=rf"k.npy: the header's shape \({n},\) has a negative"):
        npy_rows(tmp_path / "k.npy", tmp_path / "v.npy", 4)
    np.save(tmp_path / "k.npy", np.arange(3))
    (tmp_path / "v.npy").write_bytes(npy((3, -4), "<f4"))
    with pytest.raises(FormatError, match=r"v.npy: the header's shape \(3, -4\) has a negative"):
        npy_rows(tmp_path / "k.npy", tmp_path / "v.npy", -4)


def test_a_huge_row_count_is_refused_by_the_file_size(tmp_path: Path) -> None:
    n = 10**15
    (tmp_path / "k.npy").write_bytes(npy((n,), "<i8"))
    (tmp_path / "v.npy").write_bytes(npy((n, 4), "<f4"))
    want = 128 + n * 8
    with pytest.raises(
        FormatError,
        match=rf"k.npy: the header declares int64\({n},\), so {want} bytes \(128 of header\), "
        r"but the file has 128 bytes$",
    ):
        npy_rows(tmp_path / "k.npy", tmp_path / "v.npy", 4)


def test_a_truncated_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    hk = save(tmp_path / "k.npy", np.arange(10, dtype=np.int64))
    hv = save(tmp_path / "v.npy", rows(np.arange(10), 4))
    assert npy_rows(tmp_path / "k.npy", tmp_path / "v.npy", 4) == 10
    with open(tmp_path / "v.npy", "r+b") as f:
        f.truncate(hv + 9 * 16 + 3)  # the last row cut short
    with pytest.raises(
        FormatError,
        match=rf"v.npy: the header declares float32\(10, 4\), so {hv + 160} bytes "
        rf"\({hv} of header\), but the file has {hv + 147} bytes",
    ):
        list(read_npy_pair(tmp_path / "k.npy", tmp_path / "v.npy", 4))
    (tmp_path / "k.npy").write_bytes(npy((10,), ">u8"))  # a header and no data
    with pytest.raises(FormatError, match=rf"k.npy: .* so {hk + 80} bytes .* has {hk} bytes"):
        npy_rows(tmp_path / "k.npy", tmp_path / "v.npy", 4)


def test_an_oversized_file_is_refused(tmp_path: Path) -> None:
    keys = np.arange(6, dtype=np.int32)
    hk = save(tmp_path / "k.npy", keys)
    save(tmp_path / "v.npy", rows(keys, 2))
    with open(tmp_path / "k.npy", "ab") as f:
        f.write(b"\0" * 4)  # a seventh key the header does not count
    with pytest.raises(
        FormatError, match=rf"k.npy: .* int32\(6,\), so {hk + 24} bytes .* has {hk + 28} bytes"
    ):
        npy_rows(tmp_path / "k.npy", tmp_path / "v.npy", 2)


def test_empty_arrays_are_still_read(tmp_path: Path) -> None:
    np.save(tmp_path / "k.npy", np.empty(0, np.int64))
    np.save(tmp_path / "v.npy", np.empty((0, 4), np.float32))
    assert npy_rows(tmp_path / "k.npy", tmp_path / "v.npy", 4) == 0
    assert list(read_npy_pair(tmp_path / "k.npy", tmp_path / "v.npy", 4)) == []
