"""A .npy header is checked against its file: no negative length, and exactly the bytes it
declares, before anything is read or allocated (a FormatError, a 422 at the control plane)."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest

from hps.errors import FormatError
from hps.io.npy import MAX_HEADER_BYTES, NpyPairWriter, npy_rows, read_npy_pair
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


def v2_header(length: int, text: bytes) -> bytes:
    """A version-2.0 .npy start declaring a header of ``length`` bytes, then ``text``."""
    return b"\x93NUMPY\x02\x00" + struct.pack("<I", length) + text


def test_a_header_longer_than_its_file_is_refused_unread(tmp_path: Path) -> None:
    """A header declaring 4 GiB in a 13-byte file: refused by the file's size, not read
    (numpy would first allocate what it declares)."""
    np.save(tmp_path / "k.npy", np.arange(3))
    (tmp_path / "v.npy").write_bytes(v2_header(2**32 - 1, b"{"))
    with pytest.raises(FormatError) as exc:
        npy_rows(tmp_path / "k.npy", tmp_path / "v.npy", 4)
    assert str(exc.value) == (
        f"{tmp_path / 'v.npy'}: not a .npy file: its header declares 4,294,967,295 bytes, "
        "more than the file's 13"
    )


def test_a_header_beyond_numpys_limit_is_one_line(tmp_path: Path) -> None:
    np.save(tmp_path / "k.npy", np.arange(3))
    text = b"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }"
    text = text.ljust(MAX_HEADER_BYTES + 1 - 1) + b"\n"
    (tmp_path / "v.npy").write_bytes(v2_header(len(text), text) + rows(np.arange(3), 4).tobytes())
    with pytest.raises(FormatError) as exc:
        npy_rows(tmp_path / "k.npy", tmp_path / "v.npy", 4)
    assert str(exc.value) == (
        f"{tmp_path / 'v.npy'}: a .npy header of 10,001 bytes, more than the 10,000 read safely"
    )


def test_float64_vectors_beyond_float32_are_named_not_nan(
    tmp_path: Path, recwarn: pytest.WarningsRecorder
) -> None:
    np.save(tmp_path / "k.npy", np.arange(3))
    vectors = rows(np.arange(3), 4).astype(np.float64)
    vectors[1, 2] = -1e300
    np.save(tmp_path / "v.npy", vectors)
    with pytest.raises(FormatError) as exc:
        list(read_npy_pair(tmp_path / "k.npy", tmp_path / "v.npy", 4))
    assert str(exc.value) == f"{tmp_path / 'v.npy'}: row 1 holds -1e+300, beyond float32's range"
    assert not recwarn.list  # no overflow warning from a cast


def test_float64_vectors_within_float32_and_their_nans_read_as_before(tmp_path: Path) -> None:
    np.save(tmp_path / "k.npy", np.arange(3))
    vectors = rows(np.arange(3), 4).astype(np.float64)
    vectors[0, 0], vectors[2, 3] = np.nan, np.inf  # found by the import's validation
    np.save(tmp_path / "v.npy", vectors)
    ((_, got),) = read_npy_pair(tmp_path / "k.npy", tmp_path / "v.npy", 4)
    np.testing.assert_array_equal(got, vectors.astype(np.float32))


# -- writing -----------------------------------------------------------------------------------


def test_the_writer_writes_exactly_the_paths_named_in_chunks(tmp_path: Path) -> None:
    keys = np.arange(10, dtype=np.int64) * 7
    with NpyPairWriter(tmp_path / "keys", tmp_path / "vectors.bin", np.float16, 4) as w:
        for lo in range(0, 10, 4):
            w.write(keys[lo : lo + 4], rows(keys[lo : lo + 4], 4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keys", "vectors.bin"]
    assert w.rows == 10
    np.testing.assert_array_equal(np.load(tmp_path / "keys"), keys)
    got = np.load(tmp_path / "vectors.bin")
    assert got.dtype == np.float16 and got.shape == (10, 4)
    np.testing.assert_array_equal(got, rows(keys, 4).astype(np.float16))
    assert npy_rows(tmp_path / "keys", tmp_path / "vectors.bin", 4) == 10


def test_a_write_that_fails_leaves_the_files_as_they_were(tmp_path: Path) -> None:
    np.save(tmp_path / "k.npy", np.arange(3))
    np.save(tmp_path / "v.npy", rows(np.arange(3), 4))
    before = [(tmp_path / n).read_bytes() for n in ("k.npy", "v.npy")]
    for stop in (KeyboardInterrupt, OSError):
        writer = NpyPairWriter(tmp_path / "k.npy", tmp_path / "v.npy", np.float32, 4)
        with pytest.raises(stop), writer as w:
            w.write(np.arange(5), rows(np.arange(5), 4))
            raise stop
        assert [(tmp_path / n).read_bytes() for n in ("k.npy", "v.npy")] == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["k.npy", "v.npy"]
