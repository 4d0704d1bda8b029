"""HugeCTR sparse-model folders, keyset files and .npy pairs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps.build import build_session
from hps.errors import FormatError, SparseModelError
from hps.io.importer import import_model, import_sparse_model, l3_holds, preload_volatile
from hps.io.keyset import read_keyset, write_keyset
from hps.io.npy import read_npy_pair, write_npy_pair
from hps.io.sparse_model import read_sparse_model, sparse_model_rows, write_sparse_model
from tests.helpers import make_config, rows


def test_sparse_model_round_trip_in_chunks(tmp_path: Path) -> None:
    keys = np.arange(-50, 50, dtype=np.int64) * 3
    write_sparse_model(tmp_path / "t.model", keys, rows(keys, 4))
    assert (tmp_path / "t.model" / "key").stat().st_size == 100 * 8
    assert sparse_model_rows(tmp_path / "t.model", 4) == 100
    chunks = list(read_sparse_model(tmp_path / "t.model", 4, chunk_rows=32))
    assert [k.size for k, _ in chunks] == [32, 32, 32, 4]
    np.testing.assert_array_equal(np.concatenate([k for k, _ in chunks]), keys)
    np.testing.assert_array_equal(np.concatenate([v for _, v in chunks]), rows(keys, 4))


def test_truncated_sparse_model_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    session = build_session(make_config(tmp_path))
    keys = np.arange(10, dtype=np.int64)
    session.insert("demo.t0", keys[:2], rows(keys[:2], 4, seed=7))
    write_sparse_model(tmp_path / "t.model", keys, rows(keys, 4))
    with open(tmp_path / "t.model" / "emb_vector", "r+b") as f:
        f.truncate(10 * 4 * 4 - 6)
    with pytest.raises(SparseModelError, match="truncated"):
        import_sparse_model(session, session.tables["demo.t0"], tmp_path / "t.model")
    np.testing.assert_array_equal(session.lookup("demo.t0", keys[:2]), rows(keys[:2], 4, seed=7))
    assert session.persistent is not None and session.persistent.size("demo.t0") == 2
    (tmp_path / "empty").mkdir()
    with pytest.raises(SparseModelError, match="missing file 'key'"):
        sparse_model_rows(tmp_path / "empty", 4)
    session.close()


def test_import_model_respects_initial_cache_rate_and_skips_loaded_tables(tmp_path: Path) -> None:
    keys = np.arange(100, dtype=np.int64)
    paths = [tmp_path / "t0.model", tmp_path / "t1.model"]
    write_sparse_model(paths[0], keys, rows(keys, 4))
    write_sparse_model(paths[1], keys[:10], rows(keys[:10], 8))
    cfg = make_config(
        tmp_path,
        volatile_db={"type": "hash_map", "initial_cache_rate": 0.25},
        models=[
            {
                "model": "demo",
                "embedding_table_names": ["t0", "t1"],
                "embedding_vecsize_per_table": [4, 8],
                "sparse_files": [str(p) for p in paths],
                "gpucache": False,
            }
        ],
    )
    session = build_session(cfg)
    done = import_model(session, cfg.models[0], initial_cache_rate=0.25, progress=False)
    assert done == {"demo.t0": 100, "demo.t1": 10}
    assert session.volatile is not None and session.persistent is not None
    assert session.volatile.size("demo.t0") == 0  # process-local L2: the server preloads it
    assert preload_volatile(session, 0.25) == {"demo.t0": 25, "demo.t1": 2}
    assert session.volatile.size("demo.t0") == 25
    assert session.persistent.size("demo.t0") == 100
    assert l3_holds(session, session.tables["demo.t0"], paths[0])
    assert import_model(session, cfg.models[0], progress=False) == {}
    np.testing.assert_array_equal(session.lookup("demo.t0", keys), rows(keys, 4))
    session.close()


def test_keyset_round_trip_and_bad_size(tmp_path: Path) -> None:
    keys = np.array([5, -1, 2**40], dtype=np.int64)
    write_keyset(tmp_path / "k.keyset", keys)
    assert (tmp_path / "k.keyset").read_bytes() == keys.tobytes()
    np.testing.assert_array_equal(read_keyset(tmp_path / "k.keyset"), keys)
    (tmp_path / "bad.keyset").write_bytes(b"\0" * 12)
    with pytest.raises(FormatError, match="12 bytes"):
        read_keyset(tmp_path / "bad.keyset")


def test_npy_pair(tmp_path: Path) -> None:
    keys = np.arange(7, dtype=np.int32)
    write_npy_pair(tmp_path / "k.npy", tmp_path / "v.npy", keys, rows(keys, 3))
    chunks = list(read_npy_pair(tmp_path / "k.npy", tmp_path / "v.npy", 3, chunk_rows=3))
    assert [k.dtype for k, _ in chunks] == [np.int64] * 3
    np.testing.assert_array_equal(np.concatenate([v for _, v in chunks]), rows(keys, 3))
    with pytest.raises(FormatError, match=r"vectors must be float \(n, 4\)"):
        list(read_npy_pair(tmp_path / "k.npy", tmp_path / "v.npy", 4))
    np.save(tmp_path / "k2.npy", np.arange(6))
    with pytest.raises(FormatError, match="6 keys but 7 vectors"):
        list(read_npy_pair(tmp_path / "k2.npy", tmp_path / "v.npy", 3))
