"""A frequency file that is not one (a plain .npy, a damaged .npz) is a FormatError naming
it (a 422 at the control plane), never another exception."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from hps.errors import FormatError
from hps.io.frequency import read_frequency_file, write_frequency_file

NOT_ONE = r"not a frequency file \(\.npz with keys, counts\)"


def npz(compressed: bool) -> bytes:
    b = io.BytesIO()
    save = np.savez_compressed if compressed else np.savez
    save(b, keys=np.arange(1, 40, dtype=np.int64), counts=np.arange(39, dtype=np.float32))
    return b.getvalue()


def test_a_plain_npy_is_refused_as_such(tmp_path: Path) -> None:
    np.save(tmp_path / "keys.npy", np.arange(1, 10, dtype=np.int64))
    with pytest.raises(FormatError, match=rf"keys.npy: {NOT_ONE}: a plain .npy array$"):
        read_frequency_file(tmp_path / "keys.npy")


@pytest.mark.parametrize(
    "data",
    [b"", b"PK", b"PK\x03\x04" + b"\0" * 60, b"PK\x05\x06" + b"\0" * 18, b"\x93NUMPY"],
    ids=["empty", "two-bytes", "zip-magic-then-zeros", "empty-zip-damaged", "npy-magic-only"],
)
def test_damaged_files_are_format_errors(tmp_path: Path, data: bytes) -> None:
    (tmp_path / "f.npz").write_bytes(data)
    with pytest.raises(FormatError, match=rf"f.npz: ({NOT_ONE}|a frequency file needs)"):
        read_frequency_file(tmp_path / "f.npz")


def test_a_directory_or_a_missing_file_is_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match=NOT_ONE):
        read_frequency_file(tmp_path)
    with pytest.raises(FormatError, match=NOT_ONE):
        read_frequency_file(tmp_path / "missing.npz")


@pytest.mark.parametrize("compressed", [False, True], ids=["savez", "savez_compressed"])
def test_every_truncation_and_every_damaged_byte_is_a_format_error_or_reads(
    tmp_path: Path, compressed: bool
) -> None:
    good = npz(compressed)
    path = tmp_path / "f.npz"
    for cut in range(len(good)):
        path.write_bytes(good[:cut])
        with pytest.raises(FormatError, match="f.npz: "):
            read_frequency_file(path)
    for at in range(len(good)):
        damaged = bytearray(good)
        damaged[at] ^= 0xFF
        path.write_bytes(bytes(damaged))
        try:
            keys, counts = read_frequency_file(path)
        except FormatError as exc:
            assert str(exc).startswith(f"{path}: "), exc
        else:  # bytes zipfile does not check (times, attributes, the comment): same arrays
            assert keys.dtype == np.int64 and keys.shape == counts.shape


def test_a_member_that_is_not_an_array_is_a_format_error(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "f.npz", "w") as z:
        z.writestr("keys.npy", b"not an array")
        z.writestr("counts.npy", b"nor this")
    with pytest.raises(FormatError, match="f.npz: 'keys' and 'counts' must be .npy arrays"):
        read_frequency_file(tmp_path / "f.npz")


def test_unsigned_keys_beyond_int64_are_refused_not_wrapped(tmp_path: Path) -> None:
    np.savez(tmp_path / "f.npz", keys=np.array([3, 2**63 + 1], ">u8"), counts=np.array([1, 2]))
    with pytest.raises(FormatError, match=f"f.npz: key {2**63 + 1} at row 1 does not fit"):
        read_frequency_file(tmp_path / "f.npz")


def test_a_good_file_still_reads(tmp_path: Path) -> None:
    write_frequency_file(tmp_path / "f.npz", np.array([9, 4]), np.array([2, 7]))
    keys, counts = read_frequency_file(tmp_path / "f.npz")
    assert keys.dtype == np.int64 and keys.tolist() == [9, 4] and counts.tolist() == [2, 7]
