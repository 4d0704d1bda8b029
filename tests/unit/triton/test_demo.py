"""`hps demo`'s model and the client helpers (no server needed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hps.cli import main
from hps.config import load_config
from hps.errors import BackendUnavailable, RequestError, UnknownTableError
from hps.io.sparse_model import read_sparse_model
from hps.triton.client import ctr_request, translate
from hps.triton.ctr import DenseNetwork
from hps.triton.demo import create_demo, table_sizes, table_vectors


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


def test_ctr_request_shapes() -> None:
    dense, keys, rowindex = ctr_request(4, [8, 8, 4], 13, [10, 20, 30], np.random.default_rng(0))
    assert dense.shape == (4 * 13,) and keys.shape == (12,)
    assert rowindex.tolist() == [0, 1, 2, 3, 4] * 3
    assert (keys[:4] < 10).all() and (keys[8:] < 30).all()


class FakeError(Exception):
    def __init__(self, msg: str, status: str | None) -> None:
        super().__init__(msg)
        self._msg, self._status = msg, status

    def message(self) -> str:
        return self._msg

    def status(self) -> str | None:
        return self._status


@pytest.mark.parametrize(
    "msg,status,kind",
    [
        ("ShapeError: counts", "400", RequestError),
        ("Request for unknown model: 'x' is not found", "400", UnknownTableError),
        ("down", "StatusCode.UNAVAILABLE", BackendUnavailable),
        ("gone", "StatusCode.NOT_FOUND", UnknownTableError),
    ],
)
def test_translate_client_errors(msg: str, status: str, kind: type) -> None:
    err = translate(FakeError(msg, status))
    assert type(err) is kind and str(err) == msg


def test_banner_command_runs_this_hps(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    from hps.triton.commands import _hps_command

    script = tmp_path / "venv" / "bin" / "hps"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script)])
    monkeypatch.setenv("PATH", "/nonexistent")
    assert _hps_command() == "venv/bin/hps"
    monkeypatch.setattr(sys, "argv", ["/somewhere/cli.py"])
    assert _hps_command() == f"{sys.executable} -m hps.cli"
