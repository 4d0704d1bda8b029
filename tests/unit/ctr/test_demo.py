"""`hps demo`'s model: its tables, weights and ps.json, and the command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hps.cli import main
from hps.config import load_config
from hps.ctr.demo import create_demo, table_sizes, table_vectors
from hps.ctr.network import DenseNetwork
from hps.io.sparse_model import read_sparse_model


def test_create_demo(tmp_path: Path) -> None:
    path = create_demo(tmp_path / "demo", num_tables=3, max_rows=5000, dim=8)
    config = load_config(path)
    model = config.models[0]
    assert config.volatile_db.type == "hash_map" and config.persistent_db.type == "rocks_db"
    assert not config.update_source.enabled
    assert [t.table for t in model.tables] == ["C1", "C2", "C3"]
    sizes = table_sizes(3, 5000)
    assert sizes[0] == 5000 and sizes[-1] == 1000
    keys, vectors = next(read_sparse_model(model.sparse_files[1], 8))
    assert keys.tolist() == list(range(sizes[1]))
    np.testing.assert_array_equal(vectors, table_vectors(keys, 8, 1))
    net = DenseNetwork(model.dense_file, "numpy")
    assert net.input_width == model.maxnum_des_feature_per_sample + 3 * 8
    before = path.stat().st_mtime_ns
    assert create_demo(tmp_path / "demo") == path and path.stat().st_mtime_ns == before


def test_demo_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["demo", "--dir", str(tmp_path / "d"), "--tables", "2", "--rows", "1000"]
    assert main(args) == 0
    assert "created demo model" in capsys.readouterr().out
    assert main(args) == 0
    assert "using existing" in capsys.readouterr().out
    doc = json.loads((tmp_path / "d" / "ps.json").read_text())
    assert len(doc["models"][0]["sparse_files"]) == 2
