"""`hps import`, `hps export` and `hps lookup` as a user runs them, on real RocksDB files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hps.io.sparse_model import SparseModelWriter, read_sparse_model, write_sparse_model
from tests.helpers import rows

pytestmark = pytest.mark.integration


def _ps(tmp_path: Path, sparse: list[str], dims: list[int]) -> Path:
    doc = {
        "models": [
            {
                "model": "demo",
                "embedding_table_names": [f"t{i}" for i in range(len(dims))],
                "embedding_vecsize_per_table": dims,
                "sparse_files": sparse,
                "gpucache": False,
            }
        ],
        "volatile_db": {"type": "hash_map"},
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rocksdb")},
    }
    path = tmp_path / "ps.json"
    path.write_text(json.dumps(doc))
    return path


def hps(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hps.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_import_lookup_export_round_trip(tmp_path: Path) -> None:
    keys = np.arange(1000, dtype=np.int64) * 11
    write_sparse_model(tmp_path / "t0.model", keys, rows(keys, 4))
    ps = _ps(tmp_path, [str(tmp_path / "t0.model")], [4])
    done = hps("import", "--config", str(ps))
    assert done.returncode == 0, done.stderr
    assert "demo.t0: 1000 rows" in done.stdout
    assert "import demo.t0: 1,000/1,000 rows" in done.stderr  # the progress bar

    out = hps("lookup", "--config", str(ps), "--table", "demo.t0", "--json", "22", "23")
    assert out.returncode == 0, out.stderr
    got = [json.loads(line) for line in out.stdout.splitlines()]
    assert got[0] == {"key": 22, "vector": rows(np.array([22]), 4)[0].tolist()}
    assert got[1] == {"key": 23, "vector": [0.0] * 4}

    exported = hps(
        "export", "--config", str(ps), "--table", "demo.t0", "--sparse", str(tmp_path / "out")
    )
    assert exported.returncode == 0, exported.stderr
    (k, v), *_ = read_sparse_model(tmp_path / "out", 4, chunk_rows=10_000)
    order = np.argsort(k)
    np.testing.assert_array_equal(k[order], keys)
    np.testing.assert_array_equal(v[order], rows(keys, 4))

    npy = hps("import", "--config", str(ps), "--table", "demo.t0", "--npy", "/nope/k.npy", "x.npy")
    assert npy.returncode == 2 and "/nope/k.npy: cannot read" in npy.stderr


def test_bad_input_exits_with_a_message(tmp_path: Path) -> None:
    ps = _ps(tmp_path, [], [4])
    missing = hps("lookup", "--config", str(ps), "--table", "demo.t0", "1")
    assert missing.returncode == 2 and "no database at" in missing.stderr
    assert hps("import", "--config", str(ps)).returncode == 0  # creates the empty database
    bad = hps("lookup", "--config", str(ps), "--table", "demo.nope", "1")
    assert bad.returncode == 2 and "unknown table 'demo.nope'" in bad.stderr
    (tmp_path / "broken.json").write_text('{"models": [{"model": "m"}], "volatile_db": {"x": 1}}')
    broken = hps("import", "--config", str(tmp_path / "broken.json"))
    assert broken.returncode == 2
    assert "broken.json: volatile_db.x: unknown key" in broken.stderr
    assert "models[0].embedding_vecsize_per_table: Field required" in broken.stderr


def test_import_streams_in_bounded_memory(tmp_path: Path) -> None:
    """3M rows x dim 16 (192 MB of vectors) import without holding the table in memory."""
    rows_total, dim = 3_000_000, 16
    with SparseModelWriter(tmp_path / "big.model") as w:
        for lo in range(0, rows_total, 500_000):
            k = np.arange(lo, lo + 500_000, dtype=np.int64)
            w.write(k, np.broadcast_to((k % 97).astype(np.float32)[:, None], (k.size, dim)))
    ps = _ps(tmp_path, [str(tmp_path / "big.model")], [dim])
    script = (
        "import resource, sys, numpy, rocksdict\n"
        "from hps.cli import main\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"rc = main(['import', '--config', {str(ps)!r}, '--quiet'])\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print((after - before) // 1024)\n"
        "sys.exit(rc)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    grown_mb = int(res.stdout.split()[-1])
    assert grown_mb < 150, f"import grew the process by {grown_mb} MB"
