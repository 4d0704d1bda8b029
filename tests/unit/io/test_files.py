"""HugeCTR sparse-model folders, keyset files and .npy pairs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from hps.errors import BatchTooLargeError, FormatError, SparseModelError
from hps.io.keyset import read_keyset, write_keyset
from hps.io.npy import read_npy_pair
from hps.io.sparse_model import (
    SparseModelWriter,
    read_sparse_model,
    sparse_model_rows,
    write_sparse_model,
)
from tests.helpers import rows


def test_sparse_model_round_trip_in_chunks(tmp_path: Path) -> None:
    keys = np.arange(-50, 50, dtype=np.int64) * 3
    write_sparse_model(tmp_path / "t.model", keys, rows(keys, 4))
    assert (tmp_path / "t.model" / "key").stat().st_size == 100 * 8
    assert sparse_model_rows(tmp_path / "t.model", 4) == 100
    chunks = list(read_sparse_model(tmp_path / "t.model", 4, chunk_rows=32))
    assert [k.size for k, _ in chunks] == [32, 32, 32, 4]
    np.testing.assert_array_equal(np.concatenate([k for k, _ in chunks]), keys)
    np.testing.assert_array_equal(np.concatenate([v for _, v in chunks]), rows(keys, 4))


def test_keyset_round_trip_and_bad_size(tmp_path: Path) -> None:
    keys = np.array([5, -1, 2**40], dtype=np.int64)
    write_keyset(tmp_path / "k.keyset", keys)
    assert (tmp_path / "k.keyset").read_bytes() == keys.tobytes()
    np.testing.assert_array_equal(read_keyset(tmp_path / "k.keyset"), keys)
    (tmp_path / "bad.keyset").write_bytes(b"\0" * 12)
    with pytest.raises(FormatError, match="12 bytes"):
        read_keyset(tmp_path / "bad.keyset")


def test_a_keyset_beyond_a_bound_is_refused_unread(tmp_path: Path) -> None:
    write_keyset(tmp_path / "k", np.arange(5, dtype=np.int64))
    assert read_keyset(tmp_path / "k", max_keys=5).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(BatchTooLargeError, match="5 keys, more than the 4 allowed"):
        read_keyset(tmp_path / "k", max_keys=4)


def test_npy_pair(tmp_path: Path) -> None:
    keys = np.arange(7, dtype=np.int32)
    np.save(tmp_path / "k.npy", keys)  # int32 keys: read as int64
    np.save(tmp_path / "v.npy", rows(keys, 3))
    chunks = list(read_npy_pair(tmp_path / "k.npy", tmp_path / "v.npy", 3, chunk_rows=3))
    assert [k.dtype for k, _ in chunks] == [np.int64] * 3
    np.testing.assert_array_equal(np.concatenate([v for _, v in chunks]), rows(keys, 3))
    with pytest.raises(FormatError, match=r"vectors must be float \(n, 4\)"):
        list(read_npy_pair(tmp_path / "k.npy", tmp_path / "v.npy", 4))
    np.save(tmp_path / "k2.npy", np.arange(6))
    with pytest.raises(FormatError, match="6 keys but 7 vectors"):
        list(read_npy_pair(tmp_path / "k2.npy", tmp_path / "v.npy", 3))


def test_npy_unsigned_keys_beyond_int64_are_refused_not_wrapped(tmp_path: Path) -> None:
    keys = np.array([1, 2, 3, 4, 2**63 + 7, 2**64 - 1, 5], dtype=np.uint64)
    np.save(tmp_path / "k.npy", keys)
    np.save(tmp_path / "v.npy", rows(np.arange(7), 3))
    with pytest.raises(FormatError, match=r"k.npy: key 9223372036854775815 at row 4 does not fit"):
        list(read_npy_pair(tmp_path / "k.npy", tmp_path / "v.npy", 3, chunk_rows=3))
    np.save(tmp_path / "k.npy", keys[:4])  # uint64 keys that fit are read as int64
    np.save(tmp_path / "v.npy", rows(np.arange(4), 3))
    [(k, _)] = list(read_npy_pair(tmp_path / "k.npy", tmp_path / "v.npy", 3))
    assert k.dtype == np.int64 and k.tolist() == [1, 2, 3, 4]


def test_a_sparse_model_truncated_while_it_is_read_names_the_file_and_row(
    tmp_path: Path,
) -> None:
    keys = np.arange(1000, dtype=np.int64)
    write_sparse_model(tmp_path / "t.model", keys, rows(keys, 4))
    chunks = read_sparse_model(tmp_path / "t.model", 4, chunk_rows=300)
    next(chunks)
    os.truncate(tmp_path / "t.model" / "emb_vector", 4 * 4 * 500)  # rewritten in place
    with pytest.raises(SparseModelError, match=r"t.model/emb_vector: ends in row 500, before"):
        list(chunks)


def test_an_npy_pair_truncated_while_it_is_read_names_the_file_and_row(tmp_path: Path) -> None:
    np.save(tmp_path / "k.npy", np.arange(10, dtype=np.int64))
    np.save(tmp_path / "v.npy", rows(np.arange(10), 3))
    chunks = read_npy_pair(tmp_path / "k.npy", tmp_path / "v.npy", 3, chunk_rows=4)
    next(chunks)
    size = (tmp_path / "k.npy").stat().st_size
    os.truncate(tmp_path / "k.npy", size - 8 * 5)  # keys of rows 5 to 9 gone
    with pytest.raises(FormatError, match=r"k.npy: ends in row 5, before its last row 7"):
        list(chunks)


def test_a_sparse_model_written_over_replaces_it_only_once_complete(tmp_path: Path) -> None:
    """An export to a folder that holds one: a failure or an interrupt on the way leaves the
    old files whole (no truncated folder that reads as a smaller table); a complete write
    replaces them."""
    folder = tmp_path / "t.model"
    keys = np.arange(100, dtype=np.int64)
    write_sparse_model(folder, keys, rows(keys, 4))
    for stop in (KeyboardInterrupt(), SparseModelError("damaged L3")):
        with pytest.raises(type(stop)), SparseModelWriter(folder) as w:
            w.write(keys[:10], rows(keys[:10], 4, seed=1))
            raise stop
        assert sorted(p.name for p in folder.iterdir()) == ["emb_vector", "key"]
        ((got_keys, got),) = read_sparse_model(folder, 4)
        np.testing.assert_array_equal(got, rows(keys, 4))
    write_sparse_model(folder, keys[:10], rows(keys[:10], 4, seed=1))
    assert sorted(p.name for p in folder.iterdir()) == ["emb_vector", "key"]
    ((got_keys, got),) = read_sparse_model(folder, 4)
    np.testing.assert_array_equal(got, rows(keys[:10], 4, seed=1))


def test_an_unreadable_keyset_names_the_setting_that_named_it(tmp_path: Path) -> None:
    from hps.io.keyset import first_keys

    for path, why in ((tmp_path / "missing", "No such file"), (tmp_path, "Is a directory")):
        for read in (read_keyset, lambda p, **kw: first_keys(p, 4, **kw)):
            said = f"^hps_cache.warmup_keyset {path}: cannot read: {why}"
            with pytest.raises(FormatError, match=said):
                read(path, setting="hps_cache.warmup_keyset")
            with pytest.raises(OSError):  # the caller says it, without the path
                read(path)
