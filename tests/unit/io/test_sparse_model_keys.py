"""A HugeCTR sparse model saved with 32-bit keys (``i64_input_key: false``) is named as such,
with how to convert it, rather than called truncated."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.errors import SparseModelError
from hps.io.sparse_model import read_sparse_model, sparse_model_rows


def write_32bit_model(path: Path, rows: int, dim: int) -> np.ndarray:
    path.mkdir()
    keys = np.arange(rows, dtype="<u4") * 3
    keys.tofile(path / "key")
    np.ones((rows, dim), "<f4").tofile(path / "emb_vector")
    return keys


@pytest.mark.parametrize("rows", [6, 7])  # 7: not even a whole number of int64 keys
def test_32bit_keys_are_named_with_the_conversion(tmp_path: Path, rows: int) -> None:
    write_32bit_model(tmp_path / "t", rows, 4)
    with pytest.raises(SparseModelError) as err:
        sparse_model_rows(tmp_path / "t", 4)
    message = str(err.value)
    assert f"{rows} 32-bit keys" in message and "i64_input_key: false" in message
    assert "astype('<i8')" in message and "\n" not in message


def test_the_documented_conversion_reads_as_int64_keys(tmp_path: Path) -> None:
    keys = write_32bit_model(tmp_path / "t", 6, 4)
    key_file = tmp_path / "t" / "key"
    np.fromfile(key_file, "<u4").astype("<i8").tofile(key_file)  # docs/storage.md
    ((got, vectors),) = read_sparse_model(tmp_path / "t", 4)
    assert got.tolist() == keys.tolist() and vectors.shape == (6, 4)


def test_a_truncated_vector_file_is_still_called_truncated(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    np.arange(6, dtype="<i8").tofile(tmp_path / "t" / "key")
    np.ones((5, 4), "<f4").tofile(tmp_path / "t" / "emb_vector")
    with pytest.raises(SparseModelError, match="truncated file or wrong"):
        sparse_model_rows(tmp_path / "t", 4)
