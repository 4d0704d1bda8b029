"""Chunks of a pass over a whole table are sized by bytes: as many rows as before for narrow
rows (float32 up to dimension 32), a bounded number of bytes for wide ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.io import chunks
from hps.io.chunks import CHUNK_BYTES, MAX_CHUNK_ROWS, rows_per_chunk
from hps.io.npy import read_npy_pair
from hps.io.sparse_model import read_sparse_model, write_sparse_model
from tests.helpers import rows


@pytest.mark.parametrize(
    ("row_bytes", "want"),
    [
        (4, MAX_CHUNK_ROWS),  # float32 of dim 1: no more rows than before, however narrow
        (128, 1 << 18),  # float32 of dim 32: as before
        (40, 1 << 18),  # int8 of dim 32
        (4 * 1024, 8192),  # float32 of dim 1024: 32 MiB, not 1 GiB
        (1024 + 8, CHUNK_BYTES // 1032),  # int8 of dim 1024
        (4 * 65536, 128),  # float32 of the largest dimension: 32 MiB, not 64 GiB
        (CHUNK_BYTES + 1, 1),  # a row beyond the budget: one at a time
    ],
)
def test_rows_per_chunk_is_a_budget_of_bytes(row_bytes: int, want: int) -> None:
    assert CHUNK_BYTES == 32 << 20 and MAX_CHUNK_ROWS == 1 << 18
    assert rows_per_chunk(row_bytes) == want
    assert rows_per_chunk(row_bytes) * row_bytes <= max(CHUNK_BYTES, row_bytes)


def test_a_wide_sparse_model_is_read_in_chunks_of_bounded_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 64 << 10)  # 16 rows of dim 1024
    keys = np.arange(100, dtype=np.int64)
    write_sparse_model(tmp_path / "t", keys, rows(keys, 1024))
    got = list(read_sparse_model(tmp_path / "t", 1024))
    assert [k.size for k, _ in got] == [16] * 6 + [4]
    assert np.array_equal(np.concatenate([k for k, _ in got]), keys)
    assert np.array_equal(np.concatenate([v for _, v in got]), rows(keys, 1024))
    # an explicit chunk size is still taken as given
    assert [k.size for k, _ in read_sparse_model(tmp_path / "t", 1024, chunk_rows=60)] == [60, 40]


def test_float64_npy_vectors_count_their_bytes_as_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 64 << 10)  # 8 float64 rows of dim 1024
    keys = np.arange(20, dtype=np.int64)
    np.save(tmp_path / "k.npy", keys)
    np.save(tmp_path / "v.npy", rows(keys, 1024).astype(np.float64))
    got = list(read_npy_pair(tmp_path / "k.npy", tmp_path / "v.npy", 1024))
    assert [k.size for k, _ in got] == [8, 8, 4]
    assert all(v.dtype == np.float32 for _, v in got)
