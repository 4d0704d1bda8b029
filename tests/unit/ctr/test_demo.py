"""`hps demo`'s model: its tables, weights and ps.json, and the command."""

from __future__ import annotations

import json
import logging
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
    assert main(["demo", "--dir", str(tmp_path / "d")]) == 0  # nothing asked: used as it is
    assert "using existing" in capsys.readouterr().out


def test_options_an_existing_demo_was_not_made_with_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = str(tmp_path / "d")
    assert main(["demo", "--dir", d, "--tables", "2", "--rows", "1000"]) == 0
    vectors = (tmp_path / "d" / "tables" / "C1" / "emb_vector").read_bytes()
    capsys.readouterr()
    assert main(["demo", "--dir", d, "--tables", "2", "--seed", "1", "--dim", "8"]) == 2
    err = capsys.readouterr().err
    assert "holds a demo made with --dim 16, --seed 0, not what is asked" in err
    assert "--force" in err
    assert (tmp_path / "d" / "tables" / "C1" / "emb_vector").read_bytes() == vectors
    assert main(["demo", "--dir", d, "--tables", "2", "--rows", "1000", "--seed", "1",
                 "--force"]) == 0  # fmt: skip
    assert (tmp_path / "d" / "tables" / "C1" / "emb_vector").read_bytes() != vectors


@pytest.mark.parametrize(("instances", "l2"), [(1, "hash_map"), (2, "multi_process_hash_map")])
def test_the_demo_leaves_its_l2_to_the_serving_default(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, instances: int, l2: str
) -> None:
    """`hps demo --instances N && hps serve` starts quietly: one instance keeps its L2 in
    process, several share the node's, in a segment of the demo folder's own (two demos
    served at once do not meet in one)."""
    from hps.config.databases import shared_memory_name_for
    from hps.triton.serving import serving_config

    paths = [
        create_demo(tmp_path / name, num_tables=2, max_rows=1000, dim=4, instances=instances)
        for name in ("one", "two")
    ]
    assert all("type" not in json.loads(p.read_text())["volatile_db"] for p in paths)
    with caplog.at_level(logging.WARNING):
        configs = [serving_config(p) for p in paths]
    assert [c.volatile_db.type for c in configs] == [l2, l2]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    names = [c.volatile_db.shared_memory_name for c in configs]
    # every deployment's default: named after its own L3 folder, the demo's rocksdb/
    assert names == [shared_memory_name_for(str(p.parent / "rocksdb")) for p in paths]
    assert len(set(names)) == 2
    assert all("shared_memory_name" not in json.loads(p.read_text())["volatile_db"] for p in paths)
