"""A ps.json on disk with one two-table model on RocksDB, its version 1 imported."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hps.io.sparse_model import write_sparse_model
from tests.helpers import rows

KEYS = np.arange(40, dtype=np.int64)
DIMS = {"t0": 4, "t1": 8}


def write_tables(folder: Path, seed: int) -> list[str]:
    """The model's two tables as sparse-model folders; their paths, in table order."""
    paths = []
    for name, dim in DIMS.items():
        write_sparse_model(folder / name, KEYS, rows(KEYS, dim, seed))
        paths.append(str(folder / name))
    return paths


@pytest.fixture
def ps_json(tmp_path: Path) -> Path:
    return write_ps_json(tmp_path)


def write_ps_json(tmp_path: Path) -> Path:
    """The ps.json (hash-map L2, RocksDB L3 in ``tmp_path``) and its version 1 files."""
    doc = {
        "models": [
            {
                "model": "demo",
                "sparse_files": write_tables(tmp_path / "v1", seed=0),
                "embedding_table_names": list(DIMS),
                "embedding_vecsize_per_table": list(DIMS.values()),
                "maxnum_catfeature_query_per_table_per_sample": [2, 2],
                "default_value_for_each_table": [0.0, 0.0],
                "max_batch_size": 16,
                "gpucache": False,
            }
        ],
        "volatile_db": {"type": "hash_map"},
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rocksdb")},
    }
    path = tmp_path / "ps.json"
    path.write_text(json.dumps(doc))
    return path
